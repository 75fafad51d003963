package main

import (
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
)

// httpTestServer answers each POST by the payload's first word and the
// delivery's attempt, and records what it saw and how many connections it
// accepted.
type httpTestServer struct {
	*httptest.Server
	mu       sync.Mutex
	attempts map[string][]string // payload -> Streamd-Attempt of each request
	conns    atomic.Int64
}

func newHTTPTestServer(t *testing.T) *httpTestServer {
	s := &httpTestServer{attempts: map[string][]string{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *httpTestServer) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	payload, attempt := string(b), r.Header.Get("Streamd-Attempt")
	s.mu.Lock()
	s.attempts[payload] = append(s.attempts[payload], attempt)
	again := len(s.attempts[payload]) > 1
	s.mu.Unlock()
	if again { // a delivery again, in place or of a copy
		w.WriteHeader(http.StatusOK)
		return
	}
	switch strings.Fields(payload)[0] {
	case "ack":
		w.WriteHeader(http.StatusNoContent)
	case "reject":
		http.Error(w, "unprocessable", http.StatusUnprocessableEntity)
	case "limited":
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	case "unavailable":
		w.WriteHeader(http.StatusServiceUnavailable)
	case "missing":
		http.NotFound(w, r)
	case "slow":
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	}
}

func (s *httpTestServer) attemptsOf(payload string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.attempts[payload])
}

// httpSub is a subscription with an http handler posting to url.
func httpSub(name, key, url, extra string) string {
	return fmt.Sprintf(`
[[subscription]]
name = %q
stream = "orders"
key = %q
backoff = ["200ms"]
%s
[subscription.handler]
kind = "http"
url = %q
timeout = "1s"
`, name, key, extra, url)
}

// TestHTTPHandlerEndToEnd runs the daemon with an http handler against a
// real local server: 2xx is an ack, a 4xx such as 422 a drop; 429 with
// Retry-After, 503 without it, a 404 (a wrong url) and a timeout are
// failed deliveries, held and delivered again in place (the attempt stays
// 1, nothing is copied);
// a refused connection fails every delivery, and with
// max_failed_deliveries = 2 the record is settled as a retry after two, so
// that the cap sends it to the dead letters; its copy carries the attempt
// in x-ruststream-retry-count.
func TestHTTPHandlerEndToEnd(t *testing.T) {
	t.Parallel()
	srv := newHTTPTestServer(t)
	refused := httptest.NewServer(http.NotFoundHandler())
	refusedURL := refused.URL
	refused.Close() // nothing listens there any more
	e := newEnv(t, httpSub("web", "orders", srv.URL, "concurrency = 4\nmax_attempts = 3\ndead_letter = \"dead\"")+
		httpSub("down", "elsewhere", refusedURL, "max_attempts = 2\ndead_letter = \"dead\"\nmax_failed_deliveries = 2"))
	e.publish("ack 1", "reject 2", "limited 3", "unavailable 4", "slow 5", "missing 7")
	runBinary(t, []byte("[elsewhere] down 6\n"), "publish", "--file="+e.stream)
	p := e.start()

	copyAttempts := func(key, payload string) []string {
		var out []string
		for _, f := range e.framesOf(key) {
			if f.payload == payload {
				out = append(out, f.header(envelope.RetryCountHeader))
			}
		}
		return out
	}
	eventually(t, 20*time.Second, "every record to reach its final outcome", func() bool {
		return len(srv.attemptsOf("limited 3")) == 2 && len(srv.attemptsOf("unavailable 4")) == 2 &&
			len(srv.attemptsOf("slow 5")) == 2 && len(srv.attemptsOf("missing 7")) == 2 && len(copyAttempts("dead", "down 6")) == 1
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	tests := []struct {
		payload      string
		wantAttempts []string // as the server saw them
		wantCopies   []string // x-ruststream-retry-count of the records under the key, the original first
	}{
		{"ack 1", []string{"1"}, []string{""}},
		{"reject 2", []string{"1"}, []string{""}},
		{"limited 3", []string{"1", "1"}, []string{""}},
		{"unavailable 4", []string{"1", "1"}, []string{""}},
		{"slow 5", []string{"1", "1"}, []string{""}},
		{"missing 7", []string{"1", "1"}, []string{""}},
	}
	for _, tt := range tests {
		if got := srv.attemptsOf(tt.payload); !slices.Equal(got, tt.wantAttempts) {
			t.Errorf("%q: the server saw attempts %q, want %q", tt.payload, got, tt.wantAttempts)
		}
		if got := copyAttempts("orders", tt.payload); !slices.Equal(got, tt.wantCopies) {
			t.Errorf("%q: records under the key carry retry counts %q, want %q", tt.payload, got, tt.wantCopies)
		}
	}
	if got := copyAttempts("elsewhere", "down 6"); !slices.Equal(got, []string{"", "1"}) {
		t.Errorf("refused connection: records under the key carry retry counts %q, want the original and one copy", got)
	}
	if got := copyAttempts("dead", "down 6"); !slices.Equal(got, []string{"2"}) {
		t.Errorf("refused connection: dead letters carry retry counts %q, want one counting both deliveries", got)
	}
	if got := copyAttempts("dead", "reject 2"); len(got) != 0 {
		t.Errorf("a 4xx drop made dead letters: %q", got)
	}
	log := p.stderr.String()
	// The first failure of each subscription is logged; the later ones are
	// counted (and summed up once a minute while the hold lasts).
	for _, want := range []string{"connection refused", "outcome=drop seq=2", "delivery failed; holding the record", "the handler answers again"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not mention %q:\n%s", want, log)
		}
	}
}

// TestHTTPHandlerKeepAliveEndToEnd: 200 records through 4 workers use a
// handful of connections: they are kept alive and reused. (net/http may dial
// one more while a finished request's connection is being put back, so the
// bound is twice the workers, not the workers.)
func TestHTTPHandlerKeepAliveEndToEnd(t *testing.T) {
	t.Parallel()
	srv := newHTTPTestServer(t)
	e := newEnv(t, httpSub("web", "orders", srv.URL, "concurrency = 4"))
	lines := make([]string, 200)
	for i := range lines {
		lines[i] = fmt.Sprintf("ack %d", i)
	}
	e.publish(lines...)
	p := e.start()
	eventually(t, 20*time.Second, "200 deliveries", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.attempts) == 200
	})
	p.stop(t)
	if n := srv.conns.Load(); n > 8 {
		t.Errorf("200 requests from 4 workers opened %d connections, want at most 8", n)
	}
}

// TestReloadRereadsHandlerFiles: a reload rebuilds the handler of a
// subscription whose configuration is unchanged but whose files changed
// (a bearer token rotated): the records after it go with the new token,
// and none is delivered again.
func TestReloadRereadsHandlerFiles(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string][]string{} // payload -> Authorization of each request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[string(b)] = append(seen[string(b)], r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	authOf := func(payload string) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen[payload])
	}
	e := newEnv(t, "")
	token := filepath.Join(e.dir, "token")
	writeToken := func(s string) {
		if err := os.WriteFile(token, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeToken("one")
	e.writeConfig(httpSub("web", "orders", srv.URL, "") + fmt.Sprintf("bearer_token_file = %q\n", token))
	e.publish("r1")
	p := e.start()
	eventually(t, 20*time.Second, "r1", func() bool { return len(authOf("r1")) == 1 })
	writeToken("two")
	p.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, "the reload", func() bool { return p.logCount("configuration reloaded") == 1 })
	e.publish("r2")
	eventually(t, 20*time.Second, "r2", func() bool { return len(authOf("r2")) == 1 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := authOf("r1"); !slices.Equal(got, []string{"Bearer one"}) {
		t.Errorf("r1 went with %q, want once with the first token", got)
	}
	if got := authOf("r2"); !slices.Equal(got, []string{"Bearer two"}) {
		t.Errorf("r2 went with %q, want once with the token the reload read", got)
	}
}

// TestHTTPThroughProxy: the http handler posts through the proxy of
// $HTTP_PROXY and $HTTPS_PROXY, with the credentials of its URL: an http
// url in absolute form to the proxy, an https one through a CONNECT
// tunnel, the endpoint's certificate checked against ca_file. The
// endpoints' host names do not lead to the test's servers: only the proxy
// reaches them.
func TestHTTPThroughProxy(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var proxied, posted []string // what the proxy saw; what the TLS endpoint got
	origin := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		posted = append(posted, r.Host+" "+string(b))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(origin.Close)
	originAddr := origin.Listener.Addr().String()
	_, originPort, _ := net.SplitHostPort(originAddr)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: origin.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		proxied = append(proxied, strings.TrimSpace(r.Method+" "+r.RequestURI+" "+r.Header.Get("Proxy-Authorization")+" "+string(b)))
		mu.Unlock()
		if r.Method != http.MethodConnect {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		up, err := net.Dial("tcp", originAddr) // whatever host the tunnel names
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
	proxyURL := strings.Replace(proxy.URL, "http://", "http://user:pa%20ss@", 1)
	const auth = "Basic dXNlcjpwYSBzcw=="                     // user:pa ss
	secure := "https://example.com:" + originPort + "/ingest" // a name the endpoint's certificate holds
	e := newEnv(t, httpSub("plain", "orders", "http://origin.example:8080/ingest?q=1", "")+
		httpSub("secure", "orders", secure, "")+fmt.Sprintf("ca_file = %q\n", caFile))
	e.publish("one", "two")
	p := e.startWith(nil, "HTTP_PROXY="+proxyURL, "HTTPS_PROXY="+proxyURL, "http_proxy=", "https_proxy=", "NO_PROXY=", "no_proxy=")
	eventually(t, 10*time.Second, "both records to pass the proxy to both endpoints", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(posted) == 2 && len(proxied) >= 3
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"CONNECT example.com:" + originPort + " " + auth,
		"POST http://origin.example:8080/ingest?q=1 " + auth + " one",
		"POST http://origin.example:8080/ingest?q=1 " + auth + " two",
	}
	slices.Sort(proxied)
	// One tunnel, or another if the first was closed.
	proxied = slices.CompactFunc(proxied, func(a, b string) bool { return a == b && strings.HasPrefix(a, "CONNECT ") })
	if !slices.Equal(proxied, want) {
		t.Errorf("the proxy saw %q, want %q", proxied, want)
	}
	if want := []string{"example.com:" + originPort + " one", "example.com:" + originPort + " two"}; !slices.Equal(posted, want) {
		t.Errorf("the endpoint got %q, want %q", posted, want)
	}
}

// TestHTTPBadProxyRefused: check-config --handlers refuses a proxy
// variable the handler would misread, at the line of its handler, without
// the password, as run's start does.
func TestHTTPBadProxyRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpSub("web", "orders", "http://example.com/ingest", ""))
	cmd := exec.Command(streamdBinary(t), "check-config", "--handlers", "--config.file="+e.config)
	cmd.Env = append(quickExit(), "HTTP_PROXY=http://user:secret@proxy:99999", "http_proxy=", "NO_PROXY=", "no_proxy=", "REQUEST_METHOD=")
	out, err := cmd.CombinedOutput()
	want := fmt.Sprintf(`%s:20: subscription "web": http handler: $HTTP_PROXY=http://xxxxx@proxy:99999: the proxy port 99999 is not 1 to 65535`, e.config)
	if cmd.ProcessState.ExitCode() != exitError || !strings.Contains(string(out), want) || strings.Contains(string(out), "secret") {
		t.Errorf("check-config --handlers: %v, output:\n%s\nwant exit %d and %q", err, out, exitError, want)
	}
}
