package main

import (
	"bytes"
	"encoding/json"
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
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/offsets"
)

// batchLine is what the tests read of a line of a batch.
type batchLine struct {
	Seq     uint64            `json:"seq"`
	Headers map[string]string `json:"headers"`
	Payload []byte            `json:"payload_b64"`
}

// committed reports whether the subscription's stored position is the end
// of the env's stream file.
func (e *env) committed(sub string) bool {
	e.t.Helper()
	stored, err := offsets.Load(filepath.Join(e.dir, "state"))
	if err != nil {
		return false
	}
	fi, err := os.Stat(e.stream)
	return err == nil && stored[sub].Offset == fi.Size()
}

// TestHTTPBatchEndToEnd runs the daemon with batches against a real local
// server: the first batch gets a 503 and is delivered again whole, in
// place; then each record is answered by its payload's first word (a
// retry is answered on the first attempt only), and settled as a single
// answer would be: a copy of each retry with its retry count and origin,
// nothing for ack and drop; every position is committed.
func TestHTTPBatchEndToEnd(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var batches [][]string // the payloads of each request, with the retry count of copies
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var payloads []string
		var answer bytes.Buffer
		for line := range bytes.Lines(body) {
			var l batchLine
			if err := json.Unmarshal(line, &l); err != nil {
				t.Errorf("batch line %q: %v", line, err)
			}
			count := l.Headers[envelope.RetryCountHeader]
			payloads = append(payloads, strings.TrimSpace(string(l.Payload)+" "+count))
			outcome := strings.Fields(string(l.Payload))[0]
			if count != "" {
				outcome = "ack"
			}
			fmt.Fprintf(&answer, "{\"seq\":%d,\"outcome\":%q}\n", l.Seq, outcome)
		}
		mu.Lock()
		batches = append(batches, payloads)
		first := len(batches) == 1
		mu.Unlock()
		if r.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Errorf("Content-Type %q", r.Header.Get("Content-Type"))
		}
		if first {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		w.Write(answer.Bytes())
	}))
	defer srv.Close()
	got := func() [][]string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(batches)
	}
	e := newEnv(t, httpSub("web", "orders", srv.URL, "concurrency = 2\nmax_attempts = 3\ndead_letter = \"dead\"")+
		"batch_max_records = 4\nbatch_linger = \"50ms\"\n")
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf("%s %d", []string{"ack", "drop", "retry", "retry_after=0s"}[i%4], i))
	}
	e.publish(lines...)
	p := e.start()
	eventually(t, 20*time.Second, "every record and copy answered, positions committed", func() bool {
		return len(slices.Concat(got()...)) == 4+20+10 && e.committed("web")
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	all := got()
	if len(all[0]) != 4 || !slices.ContainsFunc(all[1:], func(b []string) bool { return slices.Equal(b, all[0]) }) {
		t.Errorf("the first batch %q, after its 503 %q; want a full batch, delivered again whole", all[0], all[1:])
	}
	var answered []string
	for _, b := range all[1:] {
		if len(b) > 4 {
			t.Errorf("a batch of %d records", len(b))
		}
		answered = append(answered, b...)
	}
	var want []string
	for _, l := range lines {
		want = append(want, l)
		if strings.HasPrefix(l, "retry") {
			want = append(want, l+" 1")
		}
	}
	slices.Sort(answered)
	slices.Sort(want)
	if !slices.Equal(answered, want) {
		t.Errorf("answered\n%q\nwant each record and each copy once\n%q", answered, want)
	}
	var copies []string
	for _, f := range e.framesOf("orders") {
		if c := f.header(envelope.RetryCountHeader); c != "" {
			copies = append(copies, fmt.Sprintf("%s %s %s", f.payload, c, f.header("x-streamd-origin")))
		}
	}
	if len(copies) != 10 || len(e.framesOf("dead")) != 0 {
		t.Errorf("copies %q and %d dead letters, want one copy of each retry and none", copies, len(e.framesOf("dead")))
	}
	for _, c := range copies {
		if !strings.HasSuffix(c, " 1 web") {
			t.Errorf("copy %q, want retry count 1 and origin web", c)
		}
	}
}

// TestReadmeBatchServer runs the README's example server for batches with
// the daemon: it acknowledges the JSON payloads and drops the others.
func TestReadmeBatchServer(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	blocks := readmeBlocks(t, "python")
	if len(blocks) != 1 {
		t.Fatalf("%d python blocks in the README, want the example server", len(blocks))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	server := exec.Command(python, "-c", blocks[0])
	server.Env = append(os.Environ(), "PORT="+port)
	var serverLog testutil.SyncBuffer
	server.Stderr = &serverLog
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		server.Process.Kill()
		server.Wait()
		if t.Failed() {
			t.Logf("server log:\n%s", serverLog.String())
		}
	}()
	e := newEnv(t, httpSub("web", "orders", "http://"+addr+"/orders", "")+"batch_max_records = 10\nbatch_linger = \"20ms\"\n")
	e.publish(`{"id":1}`, "not json", `{"id":2}`)
	p := e.start()
	eventually(t, 20*time.Second, "the records settled", func() bool { return e.committed("web") })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, want := range []string{"outcome=ack seq=1", "outcome=drop seq=2"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("the log does not mention %q:\n%s", want, p.stderr.String())
		}
	}
}
