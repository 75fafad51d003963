package handler

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
)

// testDelivery is a delivery with text, binary and oddly named headers.
func testDelivery() *Delivery {
	return &Delivery{
		Subscription: "billing",
		Key:          "orders",
		Shard:        3,
		Seq:          7,
		TimestampMs:  1700000000500,
		Attempt:      2,
		Headers: envelope.Headers{
			{Name: "content-type", Value: []byte("text/plain")},
			{Name: "x-tenant", Value: []byte("acme")},
			{Name: "bin", Value: []byte{0x00, 0xff}},
			{Name: "we ird%name", Value: []byte(" padded")},
			{Name: "empty", Value: nil},
			{Name: "stream-sequence", Value: []byte("7")},
		},
		Payload: []byte("hello"),
	}
}

// mustNewHandler builds a handler with New and closes it when the
// test ends, if it is an io.Closer.
func mustNewHandler(t *testing.T, cfg conf.Handler) Handler {
	t.Helper()
	h, err := New(t.Context(), cfg, io.Discard, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if c, ok := h.(io.Closer); ok {
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	return h
}

// checkOutcome compares an outcome with the wanted kind, a delay within
// [minDelay, maxDelay], and an error containing errPart ("" for none).
func checkOutcome(t *testing.T, got Outcome, kind OutcomeKind, minDelay, maxDelay time.Duration, errPart string) {
	t.Helper()
	if got.Kind != kind {
		t.Fatalf("outcome %v (delay %v, err %v), want %v", got.Kind, got.Delay, got.Err, kind)
	}
	if got.Delay < minDelay || got.Delay > maxDelay {
		t.Errorf("delay %v, want %v to %v", got.Delay, minDelay, maxDelay)
	}
	switch {
	case errPart == "" && got.Err != nil:
		t.Errorf("err %q, want none", got.Err)
	case errPart != "" && (got.Err == nil || !strings.Contains(got.Err.Error(), errPart)):
		t.Errorf("err %v, want one containing %q", got.Err, errPart)
	}
}

func writeTestFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestHTTPHandlerOutcomes(t *testing.T) {
	respond := func(code int, header ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i+1 < len(header); i += 2 {
				w.Header().Set(header[i], header[i+1])
			}
			w.WriteHeader(code)
		}
	}
	tests := []struct {
		name               string
		server             http.HandlerFunc
		kind               OutcomeKind
		minDelay, maxDelay time.Duration
		err                string
		failure            Failure // of a failed outcome, unless FailureOther
	}{
		{name: "200", server: respond(200), kind: OutcomeAck},
		{name: "204", server: respond(204), kind: OutcomeAck},
		{name: "400", server: respond(400), kind: OutcomeDrop, err: "http: 400 Bad Request"},
		{name: "409", server: respond(409), kind: OutcomeDrop, err: "http: 409 Conflict"},
		{name: "413", server: respond(413), kind: OutcomeDrop, err: "http: 413 Request Entity Too Large"},
		{name: "422", server: respond(422), kind: OutcomeDrop, err: "http: 422 Unprocessable Entity"},
		// A wrong url or credentials would drop every record: the record is
		// held instead, and the log says what to check.
		{name: "401", server: respond(401), kind: OutcomeFailed, failure: FailureHTTPStatus,
			err: "http: 401 Unauthorized, the server refuses the credentials: check bearer_token_file and the configured headers"},
		{name: "403", server: respond(403), kind: OutcomeFailed, failure: FailureHTTPStatus,
			err: "http: 403 Forbidden, the server refuses the credentials: check bearer_token_file"},
		{name: "404", server: respond(404), kind: OutcomeFailed, failure: FailureHTTPStatus,
			err: "http: 404 Not Found, check the url: the server takes no POST there"},
		{name: "405", server: respond(405), kind: OutcomeFailed, failure: FailureHTTPStatus, err: "http: 405 Method Not Allowed, check the url"},
		{name: "407", server: respond(407), kind: OutcomeFailed, failure: FailureHTTPStatus,
			err: "http: 407 Proxy Authentication Required, the proxy refuses the credentials: check the user and password in $HTTP_PROXY"},
		{name: "404 Retry-After is not a delay", server: respond(404, "Retry-After", "60"), kind: OutcomeFailed, failure: FailureHTTPStatus,
			err: "http: 404 Not Found, check the url"}, // the backoff step
		{name: "Streamd-Outcome ack wins over 404", server: respond(404, "Streamd-Outcome", "ack"), kind: OutcomeAck},
		{name: "Streamd-Outcome drop wins over 401", server: respond(401, "Streamd-Outcome", "drop"), kind: OutcomeDrop},
		{name: "429 Retry-After seconds", server: respond(429, "Retry-After", "3"),
			kind: OutcomeFailed, minDelay: 3 * time.Second, maxDelay: 3 * time.Second, err: "http: 429 Too Many Requests"},
		{name: "503 Retry-After HTTP-date", server: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", time.Now().Add(10*time.Second).UTC().Format(http.TimeFormat))
			w.WriteHeader(503)
		}, kind: OutcomeFailed, minDelay: 8 * time.Second, maxDelay: 10 * time.Second, err: "http: 503 Service Unavailable"},
		{name: "503 Retry-After past date", server: respond(503, "Retry-After", "Sun, 06 Nov 1994 08:49:37 GMT"),
			kind: OutcomeFailed, err: "http: 503 Service Unavailable"}, // the backoff step
		{name: "429 Retry-After 0", server: respond(429, "Retry-After", "0"),
			kind: OutcomeFailed, err: "http: 429 Too Many Requests"}, // the backoff step
		{name: "503 without Retry-After", server: respond(503), kind: OutcomeFailed,
			err: "http: 503 Service Unavailable"},
		{name: "429 without Retry-After", server: respond(429), kind: OutcomeFailed,
			err: "http: 429 Too Many Requests"},
		{name: "408", server: respond(408), kind: OutcomeFailed, err: "http: 408 Request Timeout"},
		{name: "503 invalid Retry-After", server: respond(503, "Retry-After", "soon"), kind: OutcomeFailed,
			err: `invalid Retry-After "soon"`},
		{name: "500 with body", server: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(500)
			io.WriteString(w, "boom\n")
		}, kind: OutcomeFailed, err: `http: 500 Internal Server Error: "boom\n"`},
		{name: "500 long body", server: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(500)
			io.WriteString(w, strings.Repeat("x", 10000))
		}, kind: OutcomeFailed, err: strings.Repeat("x", httpExcerptLimit) + `"...`},
		{name: "502", server: respond(502), kind: OutcomeFailed, err: "http: 502 Bad Gateway"},
		{name: "redirect not followed", server: respond(302, "Location", "/elsewhere"), kind: OutcomeFailed,
			err: `http: 302 Found, redirect to "/elsewhere" (not followed)`},
		{name: "Streamd-Outcome drop wins over 200", server: respond(200, "Streamd-Outcome", "drop"), kind: OutcomeDrop},
		{name: "Streamd-Outcome ack wins over 500", server: respond(500, "Streamd-Outcome", "ack"), kind: OutcomeAck},
		{name: "Streamd-Outcome retry", server: respond(200, "Streamd-Outcome", "retry"), kind: OutcomeRetry},
		{name: "Streamd-Outcome retry_after wins over Retry-After", server: respond(503, "Retry-After", "3", "Streamd-Outcome", "retry_after=1m30s"),
			kind: OutcomeRetryAfter, minDelay: 90 * time.Second, maxDelay: 90 * time.Second},
		{name: "Streamd-Outcome invalid", server: respond(200, "Streamd-Outcome", "later"), kind: OutcomeFailed,
			err: `http: Streamd-Outcome response header: invalid outcome "later"`},
		{name: "header past 1 MiB", server: respond(200, "X-Big", strings.Repeat("x", httpMaxHeaderBytes)), kind: OutcomeFailed,
			err: "response headers exceeded"},
		{name: "101 ends the exchange", server: func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(err)
			}
			defer conn.Close()
			buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: other\r\nConnection: Upgrade\r\n\r\n")
			buf.Flush()
			io.Copy(io.Discard, conn) // holds the connection open, as a switched protocol would, until the client closes it
		}, kind: OutcomeFailed, err: "http: 101 Switching Protocols: the server switched to another protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.server)
			t.Cleanup(srv.Close)
			h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: srv.URL, Timeout: conf.Duration(5 * time.Second)})
			got := h.Handle(t.Context(), testDelivery())
			checkOutcome(t, got, tt.kind, tt.minDelay, tt.maxDelay, tt.err)
			if tt.failure != FailureOther && got.Failure != tt.failure {
				t.Errorf("failure %v, want %v", got.Failure, tt.failure)
			}
		})
	}
}

// capturedRequest is what a test server saw.
type capturedRequest struct {
	method, host string
	header       http.Header
	body         string
	length       int64
}

func TestHTTPHandlerRequest(t *testing.T) {
	token := writeTestFile(t, "token", "s3cret\n")
	plain := &Delivery{Subscription: "audit", Key: "events", Seq: 1, TimestampMs: 5, Attempt: 1}
	tests := []struct {
		name     string
		delivery *Delivery
		cfg      conf.Handler
		host     string
		header   map[string]string
		absent   []string
		body     string
	}{
		{
			name:     "metadata, record headers, configured headers, token",
			delivery: testDelivery(),
			cfg: conf.Handler{
				Headers:         map[string]string{"X-Api-Version": "2", "Host": "api.example", "Content-Type": "application/json"},
				BearerTokenFile: token,
			},
			host: "api.example",
			header: map[string]string{
				"Content-Type":                          "text/plain",
				"Streamd-Subscription":                  "billing",
				"Streamd-Stream-Key":                    "orders",
				"Streamd-Seq":                           "7",
				"Streamd-Shard":                         "3",
				"Streamd-Timestamp-Ms":                  "1700000000500",
				"Streamd-Attempt":                       "2",
				"Streamd-Header-Content-Type":           "text/plain",
				"Streamd-Header-X-Tenant":               "acme",
				"Streamd-Header-Stream-Sequence":        "7",
				"Streamd-Header-Empty":                  "",
				"Streamd-Base64-Header-Bin":             "AP8=",
				"Streamd-Base64-Header-We%20ird%25name": "IHBhZGRlZA==",
				"X-Api-Version":                         "2",
				"Authorization":                         "Bearer s3cret",
			},
			absent: []string{"Streamd-Header-Bin", "Streamd-Header-We%20ird%25name", "Host"},
			body:   "hello",
		},
		{
			name:     "configured Content-Type, empty payload",
			delivery: plain,
			cfg:      conf.Handler{Headers: map[string]string{"Content-Type": "application/json"}},
			header: map[string]string{
				"Content-Type":         "application/json",
				"Streamd-Subscription": "audit",
				"Streamd-Stream-Key":   "events",
				"Streamd-Seq":          "1",
				"Streamd-Shard":        "0",
				"Streamd-Timestamp-Ms": "5",
				"Streamd-Attempt":      "1",
			},
			absent: []string{"Authorization"},
		},
		{
			name:     "default Content-Type",
			delivery: &Delivery{Key: "events", Payload: []byte{0, 1, 2}},
			header:   map[string]string{"Content-Type": "application/octet-stream"},
			body:     "\x00\x01\x02",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := make(chan capturedRequest, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				seen <- capturedRequest{method: r.Method, host: r.Host, header: r.Header, body: string(body), length: r.ContentLength}
			}))
			t.Cleanup(srv.Close)
			cfg := tt.cfg
			cfg.Kind, cfg.URL, cfg.Timeout = conf.HandlerHTTP, srv.URL, conf.Duration(5*time.Second)
			h := mustNewHandler(t, cfg)
			checkOutcome(t, h.Handle(t.Context(), tt.delivery), OutcomeAck, 0, 0, "")
			got := <-seen
			if got.method != http.MethodPost {
				t.Errorf("method %s, want POST", got.method)
			}
			if want := cmp.Or(tt.host, strings.TrimPrefix(srv.URL, "http://")); got.host != want {
				t.Errorf("Host %q, want %q", got.host, want)
			}
			if got.body != tt.body || got.length != int64(len(tt.body)) {
				t.Errorf("body %q (Content-Length %d), want %q", got.body, got.length, tt.body)
			}
			for name, want := range tt.header {
				if v := got.header[http.CanonicalHeaderKey(name)]; len(v) != 1 || v[0] != want {
					t.Errorf("header %s: %q, want %q", name, v, want)
				}
			}
			for _, name := range tt.absent {
				if v, ok := got.header[http.CanonicalHeaderKey(name)]; ok {
					t.Errorf("header %s: %q, want none", name, v)
				}
			}
		})
	}
}

func TestHTTPHandlerKeepAlive(t *testing.T) {
	var conns atomic.Int64
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Vary the outcome and send bodies to be drained.
		switch n.Add(1) % 3 {
		case 0:
			w.WriteHeader(200)
		case 1:
			w.WriteHeader(500)
		case 2:
			w.WriteHeader(404)
		}
		io.WriteString(w, strings.Repeat("b", 10<<10))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: srv.URL, Timeout: conf.Duration(5 * time.Second)})
	for range 50 {
		h.Handle(t.Context(), testDelivery())
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("50 sequential deliveries opened %d connections, want 1", got)
	}
}

// TestHTTPHandlerReusedConnectionClosed: a request that finds its kept-alive
// connection closed by the server before any answer (an idle timeout that
// crossed it, a server or balancer that closes after each answer without
// saying so) is sent again at once on a new connection, not failed as
// "unreachable": the server is up.
func TestHTTPHandlerReusedConnectionClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns, requests atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				// The first request of each connection is answered (a
				// 204 that does not say the connection closes), the
				// second is read, and the connection closed.
				for i := range 2 {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					requests.Add(1)
					if i == 0 {
						io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
					}
				}
			}()
		}
	}()
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: "http://" + ln.Addr().String() + "/", Timeout: conf.Duration(5 * time.Second)})
	for i := range 3 {
		checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeAck, 0, 0, "")
		if t.Failed() {
			t.Fatalf("delivery %d failed", i)
		}
	}
	// The second delivery: once on the old connection, and again on one
	// of its own, closed after it; the third on a new kept-alive one.
	if c, r := conns.Load(), requests.Load(); c != 3 || r != 4 {
		t.Errorf("%d connections, %d requests; want 3 and 4", c, r)
	}
}

// TestHTTPHandlerClosesAfterEachAnswer: a server that closes every
// connection after its answer, without saying so, fails no delivery of
// many in flight at once: a request that finds its kept-alive connection
// closed is sent again on a connection of its own, not on another kept-alive
// one the server closed too.
func TestHTTPHandlerClosesAfterEachAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
			}()
		}
	}()
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: "http://" + ln.Addr().String() + "/", Timeout: conf.Duration(5 * time.Second)})
	const workers, each = 16, 20
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		wg.Go(func() {
			for range each {
				if o := h.Handle(t.Context(), testDelivery()); o.Kind != OutcomeAck {
					failed.Add(1)
					t.Logf("%v", o.Err)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d deliveries failed", n, workers*each)
	}
}

// tlsTestServer starts a TLS server with the settings of cfg (nil: the
// defaults), whose failed handshakes are not logged, and returns it with
// a ca_file that trusts it.
func tlsTestServer(t *testing.T, name string, cfg *tls.Config) (*httptest.Server, string) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = cfg
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, writeTestFile(t, name+".pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
}

func TestHTTPHandlerTLS(t *testing.T) {
	srv, caFile := tlsTestServer(t, "ca", nil)
	// A server that speaks another protocol than TLS.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
			c.Close()
		}
	}()
	// A server that requires a client certificate, one that speaks TLS 1.1
	// at most, and one that speaks plain HTTP.
	mtls, mtlsCA := tlsTestServer(t, "mtls", &tls.Config{ClientAuth: tls.RequireAnyClientCert})
	old, oldCA := tlsTestServer(t, "old", &tls.Config{MaxVersion: tls.VersionTLS11})
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(plain.Close)
	tests := []struct {
		name    string
		url     string
		caFile  string
		kind    OutcomeKind
		failure Failure
		err     string
	}{
		{name: "ca_file trusts the server", url: srv.URL, caFile: caFile, kind: OutcomeAck},
		{name: "client certificate required", url: mtls.URL, caFile: mtlsCA, kind: OutcomeFailed, failure: FailureTLS, err: "remote error: tls: certificate required"},
		{name: "TLS 1.1 at most", url: old.URL, caFile: oldCA, kind: OutcomeFailed, failure: FailureTLS, err: "tls: "},
		{name: "plain HTTP server", url: strings.Replace(plain.URL, "http://", "https://", 1), kind: OutcomeFailed, failure: FailureTLS, err: "server gave HTTP response to HTTPS client"},
		{name: "system roots do not", url: srv.URL, kind: OutcomeFailed, failure: FailureTLS, err: "certificate"},
		{name: "another host name", url: strings.Replace(srv.URL, "127.0.0.1", "localhost", 1), caFile: caFile, kind: OutcomeFailed, failure: FailureTLS, err: "localhost"},
		{name: "no TLS server", url: "https://" + other.Addr().String(), caFile: caFile, kind: OutcomeFailed, failure: FailureTLS, err: "does not look like a TLS handshake"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: tt.url, CAFile: tt.caFile, Timeout: conf.Duration(5 * time.Second)})
			o := h.Handle(t.Context(), testDelivery())
			checkOutcome(t, o, tt.kind, 0, 0, tt.err)
			if o.Failure != tt.failure {
				t.Errorf("reason %v (%v), want %v", o.Failure, o.Err, tt.failure)
			}
		})
	}
}

func TestHTTPHandlerTransportFailures(t *testing.T) {
	const timeout = 100 * time.Millisecond
	blocked := func(t *testing.T, hook func()) string {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hook()
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		return srv.URL
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, cancel context.CancelFunc) string // returns the URL
		err   string
	}{
		{name: "timeout", err: "http: timed out after 100ms", setup: func(t *testing.T, _ context.CancelFunc) string {
			return blocked(t, func() {})
		}},
		{name: "shutdown cancels", err: "http: cancelled: context canceled", setup: func(t *testing.T, cancel context.CancelFunc) string {
			return blocked(t, cancel)
		}},
		{name: "connection refused", err: "connection refused", setup: func(t *testing.T, _ context.CancelFunc) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			return "http://" + addr + "/"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			url := tt.setup(t, cancel)
			h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: url, Timeout: conf.Duration(timeout)})
			start := time.Now()
			got := h.Handle(ctx, testDelivery())
			if elapsed := time.Since(start); elapsed > timeout+time.Second {
				t.Errorf("Handle took %v, want at most %v", elapsed, timeout+time.Second)
			}
			checkOutcome(t, got, OutcomeFailed, 0, 0, tt.err)
			if strings.Contains(got.Err.Error(), url) {
				t.Errorf("err %q repeats the URL", got.Err)
			}
		})
	}
}

// TestHTTPHandlerSilentTLSServer: a server that accepts connections and
// never speaks TLS holds neither the delivery nor the connection past the
// timeout: the handshake the transport goes on with after the request gave
// up ends too.
func TestHTTPHandlerSilentTLSServer(t *testing.T) {
	const timeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	closed := make(chan time.Time, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		io.Copy(io.Discard, conn) // until the client gives up
		closed <- time.Now()
	}()
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: "https://" + ln.Addr().String() + "/", Timeout: conf.Duration(timeout)})
	start := time.Now()
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeFailed, 0, 0, "timed out")
	select {
	case at := <-closed:
		if d := at.Sub(start); d > timeout+time.Second {
			t.Errorf("the client closed the connection %v after the request, want about %v", d, timeout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client still holds the connection 10s after the request")
	}
}

func TestHTTPHandlerConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tests := []struct {
		name string
		cfg  conf.Handler
		err  string
	}{
		{name: "missing token file", cfg: conf.Handler{BearerTokenFile: filepath.Join(dir, "nope")},
			err: "http handler: bearer_token_file: open " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{name: "empty token file", cfg: conf.Handler{BearerTokenFile: write("empty", "\n")},
			err: "http handler: bearer_token_file: " + filepath.Join(dir, "empty") + " is empty"},
		{name: "token with a space", cfg: conf.Handler{BearerTokenFile: write("spaced", "a b\n")},
			err: "the token must be one line of printable ASCII without spaces"},
		{name: "missing ca file", cfg: conf.Handler{CAFile: filepath.Join(dir, "nope.pem")},
			err: "http handler: ca_file: open "},
		{name: "ca file without PEM", cfg: conf.Handler{CAFile: write("bad.pem", "not a certificate")},
			err: "http handler: ca_file: " + filepath.Join(dir, "bad.pem") + " holds no PEM certificate"},
		{name: "bad header value", cfg: conf.Handler{Headers: map[string]string{"X-A": "a\x01b"}},
			err: "http handler: headers.X-A: not a valid HTTP header"},
		{name: "not http", cfg: conf.Handler{URL: "ftp://example.com/"},
			err: "http handler: url: use an http:// or https:// URL with a host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Kind = conf.HandlerHTTP
			if cfg.URL == "" {
				cfg.URL = "https://example.com/"
			}
			h, err := New(t.Context(), cfg, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("New: %v (%T), want an error containing %q", err, h, tt.err)
			}
		})
	}
}

// TestHTTPProxyEnv: a proxy variable that net/http would misread (as no
// proxy, or as a host named after its scheme) refuses the handler, naming
// the variable and its value without the password, when net/http would
// use a proxy for the handler's URL; the variable of the other scheme, a
// loopback endpoint and one $NO_PROXY exempts are not the handler's
// concern. A proxy for an http URL in a CGI environment is refused, as
// net/http refuses it.
func TestHTTPProxyEnv(t *testing.T) {
	tests := []struct {
		name, url string
		env       map[string]string
		err       string // "": accepted
	}{
		{name: "host and port", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "proxy.internal:3128"}},
		{name: "socks5", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "socks5://127.0.0.1:1080"}},
		{name: "https with credentials", url: "https://example.com/", env: map[string]string{"HTTPS_PROXY": "https://u:p@proxy:443"}},
		{name: "the other scheme's", url: "http://example.com/", env: map[string]string{"HTTPS_PROXY": "http://%zz"}},
		{name: "loopback endpoint", url: "http://127.0.0.1:9000/", env: map[string]string{"HTTP_PROXY": "http://%zz"}},
		{name: "exempt by NO_PROXY", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "http://%zz", "NO_PROXY": "example.com"}},
		{name: "exempt by no_proxy", url: "https://example.com/", env: map[string]string{"HTTPS_PROXY": "http://%zz", "no_proxy": "*"}},
		{name: "bad escape", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "http://%zz"},
			err: `http handler: $HTTP_PROXY=http://%zz: invalid URL escape "%zz": set it to http://HOST:PORT`},
		{name: "port not a number", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "http://proxy:abc"},
			err: `$HTTP_PROXY=http://proxy:abc: invalid port ":abc" after host`},
		{name: "port out of range", url: "https://example.com/", env: map[string]string{"HTTPS_PROXY": "http://user:s3cret@proxy:99999"},
			err: "$HTTPS_PROXY=http://xxxxx@proxy:99999: the proxy port 99999 is not 1 to 65535"},
		{name: "password not encoded", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "http://user:s3cr/t@proxy:3128"},
			err: "$HTTP_PROXY=http://xxxxx@proxy:3128: it is not a URL; percent-encode any of / ? # % @ and spaces in USER:PASSWORD"},
		{name: "scheme", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "ftp://proxy:21"},
			err: `a proxy scheme is http, https, socks5 or socks5h, not "ftp"`},
		{name: "no host", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "http://:3128"},
			err: "the proxy URL has no host"},
		{name: "lower case", url: "http://example.com/", env: map[string]string{"http_proxy": "http://%zz"},
			err: "$http_proxy=http://%zz"},
		{name: "either case", url: "http://example.com/", env: map[string]string{"HTTP_PROXY": "proxy:3128", "http_proxy": "http://%zz"},
			err: "$http_proxy=http://%zz"},
		{name: "CGI", url: "http://127.0.0.1:9000/", env: map[string]string{"HTTP_PROXY": "proxy:3128", "REQUEST_METHOD": "GET"},
			err: "http handler: the proxy of $HTTP_PROXY: refusing to use HTTP_PROXY value in CGI environment"},
		{name: "CGI, https", url: "https://example.com/", env: map[string]string{"HTTPS_PROXY": "proxy:3128", "REQUEST_METHOD": "GET"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, name := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "REQUEST_METHOD"} {
				t.Setenv(name, tt.env[name])
			}
			h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerHTTP, URL: tt.url}, io.Discard, nil)
			switch {
			case tt.err == "" && err != nil:
				t.Errorf("New: %v, want it accepted", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Errorf("New: %v (%T), want an error containing %q", err, h, tt.err)
			case err != nil && strings.Contains(err.Error(), "s3cr"):
				t.Errorf("New: %v: the password is shown", err)
			}
			if c, ok := h.(io.Closer); ok {
				c.Close()
			}
		})
	}
}

func TestHandlerOutcomeDirective(t *testing.T) {
	tests := []struct {
		in   string
		want Outcome
		err  bool
	}{
		{in: "ack", want: Outcome{Kind: OutcomeAck}},
		{in: " drop\t", want: Outcome{Kind: OutcomeDrop}},
		{in: "retry", want: Outcome{Kind: OutcomeRetry}},
		{in: "retry_after=250ms", want: Outcome{Kind: OutcomeRetryAfter, Delay: 250 * time.Millisecond}},
		{in: "retry_after=0s", want: Outcome{Kind: OutcomeRetryAfter}},
		{in: "retry_after=9999999999h", want: Outcome{Kind: OutcomeRetryAfter, Delay: math.MaxInt64}}, // cut by max_retry_after
		{in: "retry_after=1h99999999999999999999s", want: Outcome{Kind: OutcomeRetryAfter, Delay: math.MaxInt64}},
		{in: "retry_after=9999999999x", err: true},
		{in: "retry_after=1e9h", err: true},
		{in: "retry_after=-9999999999h", err: true},
		{in: "retry_after=-1s", err: true},
		{in: "retry_after=5", err: true},
		{in: "retry_after=", err: true},
		{in: "ACK", err: true},
		{in: "failed", err: true},
		{in: "", err: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseOutcomeDirective(tt.in)
			if tt.err {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("invalid outcome %q", strings.Trim(tt.in, " \t"))) {
					t.Errorf("parseOutcomeDirective(%q) = %v, %v; want an invalid outcome error", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("parseOutcomeDirective(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestHTTPRetryAfter(t *testing.T) {
	now := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{in: "3", want: 3 * time.Second, ok: true},
		{in: " 0 ", want: 0, ok: true},
		{in: "Wed, 01 May 2024 12:00:42 GMT", want: 42 * time.Second, ok: true},
		{in: "Wednesday, 01-May-24 12:01:00 GMT", want: time.Minute, ok: true}, // RFC 850
		{in: "Wed May  1 12:00:05 2024", want: 5 * time.Second, ok: true},      // asctime
		{in: "Tue, 30 Apr 2024 12:00:00 GMT", want: 0, ok: true},               // past
		{in: "99999999999999999999", want: math.MaxInt64, ok: true},            // cut by max_retry_after
		{in: "9223372037", want: math.MaxInt64, ok: true},                      // seconds beyond a time.Duration
		{in: "-1"},
		{in: "1.5"},
		{in: "soon"},
		{in: ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, ok := parseRetryAfter(tt.in, now)
			if got != tt.want || ok != tt.ok {
				t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestHTTPEscapeHeaderName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"x-tenant", "x-tenant"},
		{"we ird%name", "we%20ird%25name"},
		{"a:b/é", "a%3Ab%2F%C3%A9"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := escapeHeaderName(tt.in); got != tt.want {
			t.Errorf("escapeHeaderName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
