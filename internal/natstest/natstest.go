// Package natstest runs a real NATS server with JetStream inside a test
// process, on file storage in a directory of the test, for the tests of
// the nats handler. Only tests import it.
package natstest

import (
	"context"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is a NATS server with JetStream that a test started. It can be
// stopped and started again on the same port with the same store.
type Server struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

// Start starts a server on a free port of 127.0.0.1, storing JetStream
// in a new temporary directory; the test's cleanup stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, opts: server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
	}}
	s.Restart()
	s.opts.Port = s.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(s.Stop)
	return s
}

// URL is the server's client URL.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Stop shuts the server down and waits until it has; it does nothing when
// the server is stopped.
func (s *Server) Stop() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart starts the server again on its port with its store.
func (s *Server) Restart() {
	s.t.Helper()
	srv, err := server.NewServer(&s.opts)
	if err != nil {
		s.t.Fatalf("nats server: %v", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		s.t.Fatal("nats server: not ready for connections after 10s")
	}
	s.srv = srv
}

// Connect connects a client to the server; the test's cleanup closes it.
func (s *Server) Connect() (*nats.Conn, jetstream.JetStream) {
	s.t.Helper()
	nc, err := nats.Connect(s.URL(), nats.MaxReconnects(-1))
	if err != nil {
		s.t.Fatalf("connecting to the nats server: %v", err)
	}
	s.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		s.t.Fatal(err)
	}
	return nc, js
}

// AddStream creates a file-storage stream capturing subjects, and returns
// it.
func (s *Server) AddStream(cfg jetstream.StreamConfig) jetstream.Stream {
	s.t.Helper()
	_, js := s.Connect()
	cfg.Storage = jetstream.FileStorage
	st, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		s.t.Fatalf("creating stream %s: %v", cfg.Name, err)
	}
	return st
}

// Messages returns every message of the stream, in stream order.
func (s *Server) Messages(stream string) []jetstream.Msg {
	s.t.Helper()
	_, js := s.Connect()
	ctx := context.Background()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		s.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		s.t.Fatal(err)
	}
	msgs := make([]jetstream.Msg, 0, info.State.Msgs)
	for uint64(len(msgs)) < info.State.Msgs {
		batch, err := cons.Fetch(min(1000, int(info.State.Msgs)-len(msgs)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			s.t.Fatalf("stream %s: fetching: %v", stream, err)
		}
		n := len(msgs)
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil || len(msgs) == n {
			s.t.Fatalf("stream %s: fetched %d of %d messages: %v", stream, len(msgs), info.State.Msgs, err)
		}
	}
	return msgs
}

// Silent is an address that accepts connections and never answers, as a
// NATS server that hangs (or a firewall that lets the handshake through)
// does: a client gives up on each connection after its timeout.
type Silent struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   map[net.Conn]bool // open now
	accepts []time.Time
	stopped bool
}

// StartSilent listens on a free port of 127.0.0.1; the test's cleanup
// stops it.
func StartSilent(t testing.TB) *Silent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Silent{ln: ln, conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.accepts = append(s.accepts, time.Now())
			s.conns[c] = true
			if s.stopped {
				c.Close()
			}
			s.mu.Unlock()
			wg.Go(func() {
				io.Copy(io.Discard, c) // until the client gives up and closes it
				c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		s.stopped = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	return s
}

// URL is the address as a NATS URL.
func (s *Silent) URL() string { return "nats://" + s.ln.Addr().String() }

// Accepts returns when it accepted each connection.
func (s *Silent) Accepts() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.accepts)
}

// Proxy passes connections on to a server, and can say something of its
// own to the clients, as if the server had said it.
type Proxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	clients map[net.Conn]bool // open now; writes to them under mu
	n       int               // connections accepted
	stopped bool
}

// StartProxy listens on a free port of 127.0.0.1 and passes each
// connection on to the server at url; the test's cleanup stops it.
func StartProxy(t testing.TB, url string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: strings.TrimPrefix(url, "nats://"), clients: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.n++
			p.clients[c] = true
			if p.stopped {
				c.Close()
				s.Close()
			}
			p.mu.Unlock()
			wg.Go(func() {
				io.Copy(s, c)
				s.Close()
			})
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					p.mu.Lock()
					if n > 0 {
						c.Write(buf[:n])
					}
					if err != nil {
						delete(p.clients, c)
						c.Close()
					}
					p.mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.stopped = true
		for c := range p.clients {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

// URL is the proxy's address as a NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Say writes line, a protocol line such as "-ERR 'Something'\r\n", to
// every client, as if the server had said it: on an idle connection, for
// it goes between two reads of what the server sends, not two lines.
func (p *Proxy) Say(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.clients {
		c.Write([]byte(line))
	}
}

// Accepted returns how many connections the proxy accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
