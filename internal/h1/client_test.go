package h1

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testTimeout = 5 * time.Second

// newClient returns a client for rawURL, closed when the test ends.
func newClient(t testing.TB, o Options, rawURL string) *Client {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	o.URL = u
	c, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// post posts body and returns the status and the response body.
func post(t *testing.T, c *Client, r *Request) (int, string) {
	t.Helper()
	resp, err := c.Post(t.Context(), testTimeout, r)
	if err != nil {
		t.Fatalf("Post: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp.StatusCode, string(b)
}

// countConns makes srv count the connections it accepts.
func countConns(srv *httptest.Server) *atomic.Int64 {
	var n atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
	return &n
}

func TestPostRequest(t *testing.T) {
	type seen struct {
		method, uri, host string
		header            http.Header
		body              []byte
		length            int64
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Host, r.Header, b, r.ContentLength}
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, Options{}, srv.URL+"/in/box?tenant=a%20b")
	header := func(b []byte) []byte { return append(b, "X-One: 1\r\nX-Two: two words\r\n"...) }
	tests := []struct {
		name string
		req  Request
		host string
	}{
		{name: "empty body", req: Request{}},
		{name: "small body and header", req: Request{Body: []byte("hello"), AppendHeader: header}},
		{name: "body at the copy limit", req: Request{Body: bytes.Repeat([]byte("a"), copyLimit)}},
		{name: "body written with writev", req: Request{Body: bytes.Repeat([]byte("b"), copyLimit+1), AppendHeader: header}},
		{name: "1 MiB body", req: Request{Body: bytes.Repeat([]byte("0123456789abcdef"), 1<<16)}},
		{name: "Host set", req: Request{Host: "api.example", Body: []byte("x")}, host: "api.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, _ := post(t, c, &tt.req); code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			s := <-got
			if s.method != http.MethodPost || s.uri != "/in/box?tenant=a%20b" {
				t.Errorf("request line %s %s, want POST /in/box?tenant=a%%20b", s.method, s.uri)
			}
			if want := cmpOr(tt.host, strings.TrimPrefix(srv.URL, "http://")); s.host != want {
				t.Errorf("Host %q, want %q", s.host, want)
			}
			if !bytes.Equal(s.body, tt.req.Body) || s.length != int64(len(tt.req.Body)) {
				t.Errorf("body of %d bytes (Content-Length %d), want the %d sent", len(s.body), s.length, len(tt.req.Body))
			}
			if tt.req.AppendHeader != nil && (s.header.Get("X-One") != "1" || s.header.Get("X-Two") != "two words") {
				t.Errorf("header %v, want X-One and X-Two", s.header)
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func TestPostKeepsConnections(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Bodies of every framing, all read to their end by Close.
		switch n.Add(1) % 4 {
		case 0:
			w.WriteHeader(http.StatusNoContent)
		case 1:
			io.WriteString(w, strings.Repeat("b", 10<<10)) // Content-Length
		case 2:
			w.WriteHeader(http.StatusNotFound)
			w.(http.Flusher).Flush() // chunked
			io.WriteString(w, "not here")
		case 3:
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	conns := countConns(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, Options{}, srv.URL)
	for range 50 {
		resp, err := c.Post(t.Context(), testTimeout, &Request{Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // unread: Close drains it
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("50 sequential posts opened %d connections, want 1", got)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				post(t, c, &Request{Body: []byte("y")})
			}
		})
	}
	wg.Wait()
	if got := conns.Load(); got > 1+8 {
		t.Errorf("8 goroutines posting opened %d connections in all, want at most 9", got)
	}
}

func TestPostClosesConnections(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{name: "Connection: close", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
		}},
		{name: "body beyond the drain limit", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Write(bytes.Repeat([]byte("z"), DrainLimit+10))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(tt.handler)
			conns := countConns(srv)
			srv.Start()
			t.Cleanup(srv.Close)
			c := newClient(t, Options{}, srv.URL)
			for range 3 {
				resp, err := c.Post(t.Context(), testTimeout, &Request{})
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			if got := conns.Load(); got != 3 {
				t.Errorf("3 posts opened %d connections, want 3", got)
			}
		})
	}
}

// rawServer serves each connection with serve on a loopback listener and
// returns its address and a count of accepted connections.
func rawServer(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) (string, *atomic.Int64) {
	t.Helper()
	return rawServerTLS(t, nil, serve)
}

// rawServerTLS is rawServer over TLS with cfg, or plain when cfg is nil.
func rawServerTLS(t *testing.T, cfg *tls.Config, serve func(c net.Conn, br *bufio.Reader)) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			if cfg != nil {
				c = tls.Server(c, cfg)
			}
			wg.Go(func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	scheme := "http://"
	if cfg != nil {
		scheme = "https://"
	}
	return scheme + ln.Addr().String() + "/", &n
}

// testTLS returns a server TLS configuration and the roots that trust it.
func testTLS(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS() // for its certificate
	defer srv.Close()
	cfg := srv.TLS.Clone()
	cfg.NextProtos = nil
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	return cfg, roots
}

// readRequest reads one request and its body from br.
func readRequest(br *bufio.Reader) error {
	r, err := http.ReadRequest(br)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, r.Body)
	return err
}

func TestPostResponses(t *testing.T) {
	tests := []struct {
		name     string
		response string
		code     int
		body     string
	}{
		{name: "interim responses first", code: 200, body: "ok",
			response: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "chunked", code: 202, body: "hello, world",
			response: "HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n"},
		{name: "HTTP/1.0, delimited by close", code: 200, body: "old",
			response: "HTTP/1.0 200 OK\r\n\r\nold"},
		{name: "101 ends the exchange", code: 101,
			response: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
				if readRequest(br) == nil {
					io.WriteString(c, tt.response)
				}
			})
			c := newClient(t, Options{}, url)
			code, body := post(t, c, &Request{Body: []byte("x")})
			if code != tt.code || body != tt.body {
				t.Errorf("got %d %q, want %d %q", code, body, tt.code, tt.body)
			}
		})
	}
}

func TestPostStaleConnection(t *testing.T) {
	// The server answers one request per connection, keeps it alive in
	// words, and closes it: the next post finds it closed and must go
	// again on a new connection.
	var requests atomic.Int64
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequest(br) == nil {
			requests.Add(1)
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		}
	})
	c := newClient(t, Options{}, url)
	for i := range 3 {
		if code, _ := post(t, c, &Request{Body: []byte("x")}); code != http.StatusNoContent {
			t.Fatalf("post %d: status %d", i, code)
		}
		time.Sleep(10 * time.Millisecond) // the server's close arrives
	}
	if got := requests.Load(); got != 3 {
		t.Errorf("the server answered %d requests, want 3", got)
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("%d connections, want 3", got)
	}
}

func TestPostNoResponse(t *testing.T) {
	// A new connection closed without a response is an error, not a
	// reason to send again.
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) { readRequest(br) })
	c := newClient(t, Options{}, url)
	_, err := c.Post(t.Context(), testTimeout, &Request{Body: []byte("x")})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("Post: %v, want unexpected EOF", err)
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("%d connections, want 1", got)
	}
}

func TestPostTimeoutAndCancel(t *testing.T) {
	// The servers hang until the client closes the connection.
	url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		readRequest(br)
		io.Copy(io.Discard, br)
	})
	t.Run("timeout", func(t *testing.T) {
		c := newClient(t, Options{}, url)
		start := time.Now()
		_, err := c.Post(t.Context(), 100*time.Millisecond, &Request{})
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Post: %v, want a deadline error", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Post returned after %v", d)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		c := newClient(t, Options{}, url)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		if _, err := c.Post(ctx, time.Minute, &Request{}); err == nil {
			t.Error("Post succeeded, want an error")
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Post returned %v after the cancel", d)
		}
	})
	t.Run("timeout in the body", func(t *testing.T) {
		url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
			readRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
			io.Copy(io.Discard, br)
		})
		c := newClient(t, Options{}, url)
		resp, err := c.Post(t.Context(), 100*time.Millisecond, &Request{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(resp.Body); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("reading the body: %v, want a deadline error", err)
		}
		resp.Body.Close()
	})
}

func TestPostThroughProxy(t *testing.T) {
	origin := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "tls "+r.Host)
	}))
	t.Cleanup(origin.Close)
	roots := x509.NewCertPool()
	roots.AddCert(origin.Certificate())

	var mu sync.Mutex
	var seen []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.RequestURI+" "+r.Header.Get("Proxy-Authorization"))
		mu.Unlock()
		if r.Method != http.MethodConnect {
			io.WriteString(w, "proxied")
			return
		}
		up, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer up.Close()
		down, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer down.Close()
		io.WriteString(down, "HTTP/1.1 200 Connection established\r\n\r\n")
		go func() {
			io.Copy(up, brw)
			up.(*net.TCPConn).CloseWrite()
		}()
		io.Copy(down, up)
	}))
	t.Cleanup(proxy.Close)
	proxyURL, _ := url.Parse(strings.Replace(proxy.URL, "http://", "http://user:pa%20ss@", 1))
	const auth = "Basic dXNlcjpwYSBzcw==" // user:pa ss

	t.Run("http in absolute form", func(t *testing.T) {
		c := newClient(t, Options{Proxy: proxyURL}, "http://origin.example:8080/path?q=1#frag")
		if _, body := post(t, c, &Request{}); body != "proxied" {
			t.Errorf("body %q, want the proxy's", body)
		}
	})
	t.Run("https through CONNECT", func(t *testing.T) {
		c := newClient(t, Options{Proxy: proxyURL, TLS: &tls.Config{RootCAs: roots}}, origin.URL+"/x")
		_, body := post(t, c, &Request{})
		if want := "tls " + strings.TrimPrefix(origin.URL, "https://"); body != want {
			t.Errorf("body %q, want %q", body, want)
		}
	})
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"POST http://origin.example:8080/path?q=1 " + auth,
		"CONNECT " + strings.TrimPrefix(origin.URL, "https://") + " " + auth,
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("the proxy saw %q, want %q", seen, want)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		url, proxy string
		err        string
		addr       string
	}{
		{url: "http://example.com/a", addr: "example.com:80"},
		{url: "https://example.com/a", addr: "example.com:443"},
		{url: "http://[::1]:9000/", addr: "[::1]:9000"},
		{url: "https://[::1]/", addr: "[::1]:443"},
		{url: "http://example.com/", proxy: "http://proxy:3128", addr: "proxy:3128"},
		{url: "ftp://example.com/", err: "http:// or https://"},
		{url: "http:///path", err: "http:// or https://"},
		{url: "http://example.com/", proxy: "socks5://proxy:1080", err: "proxy socks5://proxy:1080: only http:// proxies are supported"},
	}
	for _, tt := range tests {
		t.Run(tt.url+" "+tt.proxy, func(t *testing.T) {
			u, _ := url.Parse(tt.url)
			o := Options{URL: u}
			if tt.proxy != "" {
				o.Proxy, _ = url.Parse(tt.proxy)
			}
			c, err := New(o)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("New: %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.addr != tt.addr {
				t.Errorf("dials %s, want %s", c.addr, tt.addr)
			}
		})
	}
}

func TestPostHandshakeBounded(t *testing.T) {
	// A server, or a proxy, that accepts the connection and says nothing:
	// the TLS handshake and the CONNECT keep to the timeout and to ctx.
	silent, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) { io.Copy(io.Discard, br) })
	silentAddr := strings.TrimSuffix(strings.TrimPrefix(silent, "http://"), "/")
	proxyURL, _ := url.Parse(silent)
	tests := []struct {
		name   string
		o      Options
		url    string
		cancel bool
	}{
		{name: "TLS handshake, timeout", url: "https://" + silentAddr + "/"},
		{name: "TLS handshake, cancel", url: "https://" + silentAddr + "/", cancel: true},
		{name: "CONNECT, timeout", o: Options{Proxy: proxyURL}, url: "https://origin.example/"},
		{name: "CONNECT, cancel", o: Options{Proxy: proxyURL}, url: "https://origin.example/", cancel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, tt.o, tt.url)
			ctx, timeout := t.Context(), 200*time.Millisecond
			if tt.cancel {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				time.AfterFunc(200*time.Millisecond, cancel)
				timeout = time.Minute
			}
			start := time.Now()
			if _, err := c.Post(ctx, timeout, &Request{}); err == nil {
				t.Fatal("Post succeeded, want an error")
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Post returned after %v, want about 200ms", d)
			}
		})
	}
}

func TestPostIdleConnectionSpoke(t *testing.T) {
	// The server answers the first request on each connection and then,
	// while the connection is idle, sends what the test names: none of it
	// may be taken for the answer to the next request.
	tests := []struct {
		name  string
		after string
	}{
		{name: "408 and close", after: "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"},
		{name: "stray bytes", after: "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var requests atomic.Int64
			url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
				for first := true; readRequest(br) == nil; first = false {
					requests.Add(1)
					io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
					if first {
						time.Sleep(20 * time.Millisecond)
						io.WriteString(c, tt.after)
					}
				}
			})
			c := newClient(t, Options{}, url)
			for i := range 2 {
				if code, _ := post(t, c, &Request{Body: []byte("x")}); code != http.StatusNoContent {
					t.Fatalf("post %d: status %d, want 204", i, code)
				}
				time.Sleep(60 * time.Millisecond)
			}
			if got := requests.Load(); got != 2 {
				t.Errorf("the server answered %d requests, want 2", got)
			}
			if got := conns.Load(); got != 2 {
				t.Errorf("%d connections, want 2", got)
			}
		})
	}
}

func TestPostKeptAlive408IsSentAgain(t *testing.T) {
	// A 408 that arrives as the request goes out on a kept-alive
	// connection (here: the server's answer to it) sends it again on a new
	// connection, where a 408 is the answer.
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		for n := 0; readRequest(br) == nil; n++ {
			if n == 0 {
				io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
				continue
			}
			io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
		}
	})
	c := newClient(t, Options{}, url)
	post(t, c, &Request{})
	if code, _ := post(t, c, &Request{}); code != http.StatusNoContent {
		t.Errorf("status %d, want the 204 of a new connection", code)
	}
	if got := conns.Load(); got != 2 {
		t.Errorf("%d connections, want 2", got)
	}
}

func TestPostEarlyResponse(t *testing.T) {
	// The server answers 413 after the header and closes without reading
	// the body: the answer is the response, not the failed write.
	url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			c.(*net.TCPConn).CloseWrite()
			time.Sleep(100 * time.Millisecond)
		}
	})
	c := newClient(t, Options{}, url)
	code, _ := post(t, c, &Request{Body: make([]byte, 32<<20)})
	if code != http.StatusRequestEntityTooLarge {
		t.Errorf("status %d, want 413", code)
	}
}

func TestPostReusesAfterTimeout(t *testing.T) {
	// Posts further apart than their timeout still share one connection:
	// the deadline of an exchange ends with it.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	conns := countConns(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, Options{}, srv.URL)
	for range 3 {
		resp, err := c.Post(t.Context(), 50*time.Millisecond, &Request{})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		time.Sleep(150 * time.Millisecond)
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("3 posts 150ms apart with a 50ms timeout opened %d connections, want 1", got)
	}
}

func TestCloseBoundsTheDrain(t *testing.T) {
	// Close reads at most DrainLimit of a body, then closes the
	// connection rather than read the rest until the timeout.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// More than DrainLimit, then the rest of a long body comes slowly.
		w.Header().Set("Content-Length", strconv.Itoa(100<<20))
		w.Write(make([]byte, 2*DrainLimit))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, Options{}, srv.URL)
	resp, err := c.Post(t.Context(), 10*time.Second, &Request{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp.Body.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with most of a slow body left, want it to stop after DrainLimit", d)
	}
}

func TestTLSSessionResumed(t *testing.T) {
	// Connections the server closes are dialled again, resuming the TLS
	// session instead of a full handshake.
	var resumed, conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS.DidResume {
			resumed.Add(1)
		}
		conns.Add(1)
		w.Header().Set("Connection", "close")
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c := newClient(t, Options{TLS: &tls.Config{RootCAs: roots}}, srv.URL)
	for range 3 {
		post(t, c, &Request{})
	}
	if conns.Load() != 3 || resumed.Load() != 2 {
		t.Errorf("%d connections, %d resumed; want 3, of which the last 2 resumed", conns.Load(), resumed.Load())
	}
}

func TestPostHeaderTooLarge(t *testing.T) {
	// A server that sends header fields without end: the client gives up
	// at MaxHeaderBytes instead of holding them all.
	url, _ := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if readRequest(br) != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		field := "X-Filler: " + strings.Repeat("f", 1000) + "\r\n"
		for range 2 * MaxHeaderBytes / len(field) {
			if _, err := io.WriteString(c, field); err != nil {
				return
			}
		}
	})
	c := newClient(t, Options{}, url)
	_, err := c.Post(t.Context(), testTimeout, &Request{})
	if !errors.Is(err, errHeaderTooLarge) {
		t.Errorf("Post: %v, want %v", err, errHeaderTooLarge)
	}
}

func TestPostStrayResponse(t *testing.T) {
	// A server that sends a second response right behind the first, in
	// its own write (over TLS, its own record, which the TLS connection
	// may read ahead into its buffers): it is never taken for the answer
	// to the next request.
	serverTLS, roots := testTLS(t)
	for _, tt := range []struct {
		name string
		tls  *tls.Config
	}{{"plain", nil}, {"TLS", serverTLS}} {
		t.Run(tt.name, func(t *testing.T) {
			url, _ := rawServerTLS(t, tt.tls, func(c net.Conn, br *bufio.Reader) {
				for n := 0; readRequest(br) == nil; n++ {
					if n == 0 {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray")
						continue
					}
					io.WriteString(c, "HTTP/1.1 202 Accepted\r\nContent-Length: 4\r\n\r\nreal")
				}
			})
			c := newClient(t, Options{TLS: &tls.Config{RootCAs: roots}}, url)
			for i := range 20 {
				if _, body := post(t, c, &Request{}); body == "stray" {
					t.Fatalf("post %d got the stray response sent before it", i)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func TestIdleConnectionsExpire(t *testing.T) {
	// Three connections after a burst; then one at a time uses only the
	// last one put back. The two beneath it are closed once they have been
	// idle for IdleTimeout.
	var closed atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := newClient(t, Options{IdleTimeout: 200 * time.Millisecond}, srv.URL)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { post(t, c, &Request{}) })
	}
	wg.Wait()
	for range 8 {
		post(t, c, &Request{})
	}
	eventually(t, 2*time.Second, func() bool { return closed.Load() == 2 })
}

// eventually waits up to d for cond.
func eventually(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met in time")
		}
	}
}
