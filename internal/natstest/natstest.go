// Package natstest runs a real NATS server with JetStream inside a test
// process, on file storage in a directory of the test, for the tests of
// the nats handler. Only tests import it.
package natstest

import (
	"bufio"
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

// listener accepts connections on a free port of 127.0.0.1 and serves
// each on a goroutine of its own until the test's cleanup, which closes
// the connections still open and waits for those goroutines.
type listener struct {
	ln      net.Listener
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]bool // open now; written to under mu
	accepts []time.Time
	stopped bool
	hanging bool // a Proxy's: it answers no connection any more
}

// listen starts a listener that serves each connection with serve, which
// returns when it is done with it.
func listen(t testing.TB, serve func(l *listener, c net.Conn)) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{ln: ln, conns: map[net.Conn]bool{}}
	l.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.accepts = append(l.accepts, time.Now())
			l.conns[c] = true
			if l.stopped {
				c.Close()
			}
			l.mu.Unlock()
			l.wg.Go(func() {
				serve(l, c)
				c.Close()
				l.mu.Lock()
				delete(l.conns, c)
				l.mu.Unlock()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		l.stopped = true
		for c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

// URL is the address as a NATS URL.
func (l *listener) URL() string { return "nats://" + l.ln.Addr().String() }

// Accepts returns when it accepted each connection.
func (l *listener) Accepts() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.accepts)
}

// write writes b to c, between the other writes to the listener's
// connections.
func (l *listener) write(c net.Conn, b []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.Write(b)
}

// Silent is an address that accepts connections and never answers, as a
// NATS server that hangs (or a firewall that lets the handshake through)
// does: a client gives up on each connection after its timeout.
type Silent struct{ *listener }

// StartSilent listens on a free port of 127.0.0.1; the test's cleanup
// stops it.
func StartSilent(t testing.TB) *Silent {
	t.Helper()
	return &Silent{listen(t, func(_ *listener, c net.Conn) {
		io.Copy(io.Discard, c) // until the client gives up and closes it
	})}
}

// Erring is a fake server that lets each client connect (INFO, then PONG
// to the client's CONNECT and PING) and then says an error line and
// closes the connection, as a server that refuses the client right after
// its handshake does.
type Erring struct{ *listener }

// StartErring listens on a free port of 127.0.0.1 and says line, such as
// "-ERR 'Something Unheard Of'\r\n", to each client once connected; the
// test's cleanup stops it.
func StartErring(t testing.TB, line string) *Erring {
	t.Helper()
	return &Erring{listen(t, func(l *listener, c net.Conn) {
		l.write(c, []byte(`INFO {"server_id":"erring","version":"2.12.0","proto":1,"headers":true,"max_payload":1048576}`+"\r\n"))
		r := bufio.NewReader(c)
		for {
			in, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(in, "PING") {
				break
			}
		}
		l.write(c, []byte("PONG\r\n"+line))
	})}
}

// Proxy passes connections on to a server, and can say something of its
// own to the clients, as if the server had said it.
type Proxy struct{ *listener }

// StartProxy listens on a free port of 127.0.0.1 and passes each
// connection on to the server at url; the test's cleanup stops it.
func StartProxy(t testing.TB, url string) *Proxy {
	t.Helper()
	return &Proxy{listen(t, func(l *listener, c net.Conn) {
		l.mu.Lock()
		hanging := l.hanging
		l.mu.Unlock()
		if hanging {
			io.Copy(io.Discard, c)
			return
		}
		s, err := net.Dial("tcp", strings.TrimPrefix(url, "nats://"))
		if err != nil {
			return
		}
		var toServer sync.WaitGroup
		toServer.Go(func() {
			io.Copy(s, c)
			s.Close()
		})
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				l.write(c, buf[:n])
			}
			if err != nil {
				break
			}
		}
		c.Close()
		toServer.Wait()
	})}
}

// Hang makes the proxy a server that hangs: it closes the connections
// open, and accepts the next ones but never answers them, as Silent.
func (p *Proxy) Hang() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hanging = true
	for c := range p.conns {
		c.Close()
	}
}

// Silence makes the proxy accept the next connections without ever
// answering them (on), as Silent, or pass them on again (off); the
// connections open are left as they are.
func (p *Proxy) Silence(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hanging = on
}

// Say writes line, a protocol line such as "-ERR 'Something'\r\n", to
// every client, as if the server had said it: on an idle connection, for
// it goes between two reads of what the server sends, not two lines.
func (p *Proxy) Say(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Write([]byte(line))
	}
}
