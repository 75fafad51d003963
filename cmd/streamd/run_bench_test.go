package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
)

// benchBinary builds streamd without the race detector, for benchmarks.
func benchBinary(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "streamd")
	if err := goBuild(bin); err != nil {
		b.Fatal(err)
	}
	return bin
}

// benchStream writes n records of the given payload size under key orders.
func benchStream(b *testing.B, path string, n, payload int) {
	b.Helper()
	p := make([]byte, payload)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	benchRecords(b, path, n, p)
}

// benchRecords writes n records under key orders, each with payload p.
func benchRecords(b *testing.B, path string, n int, p []byte) {
	b.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true,
		Header: streamfile.Header{FileName: "bench.ss", BeaconInterval: streamfile.DefaultBeaconInterval}})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	batch := make([]streamfile.Frame, 0, 1024)
	for i := range n {
		batch = append(batch, streamfile.Frame{Key: "orders", TimestampMs: uint64(time.Now().UnixMilli()), Payload: p})
		if len(batch) == cap(batch) || i == n-1 {
			if err := w.Publish(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// runReplay runs the daemon on a replay configuration until it finishes
// (every record settled, positions committed) and returns the peak RSS.
func runReplay(b *testing.B, bin, dir, handler string, concurrency int) (time.Duration, int64) {
	b.Helper()
	state := filepath.Join(dir, "state")
	os.RemoveAll(state)
	cfg := filepath.Join(dir, "streamd.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`state_dir = %q
[metrics]
listen = ""
[[stream]]
name = "orders"
path = %q
[[subscription]]
name = "bench"
stream = "orders"
key = "orders"
replay = true
concurrency = %d
%s`, state, filepath.Join(dir, "orders.ss"), concurrency, handler)), 0o644)
	cmd := exec.Command(bin, "run", "--config.file="+cfg, "--log.level=error")
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	quietDisk()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var peak int64
	for {
		select {
		case err := <-done:
			if err != nil {
				b.Fatalf("streamd: %v\n%s", err, stderr.String())
			}
			return time.Since(start), peak
		case <-time.After(20 * time.Millisecond):
			peak = max(peak, vmHWM(cmd.Process.Pid))
		}
	}
}

// quietDisk writes what the page cache holds for the disk (the stream file
// just prepared, what an earlier run stored) before a timed run, so that
// the run does not pay for the write-back of what came before it.
func quietDisk() { syscall.Sync() }

// vmHWM returns a process's peak resident set size in bytes, 0 if unknown.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// checkCommitted fails unless the stored position is the end of the file.
func checkCommitted(b *testing.B, dir string) {
	b.Helper()
	stored, err := offsets.Load(filepath.Join(dir, "state"))
	if err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "orders.ss"))
	if p := stored["bench"]; p.Offset != fi.Size() {
		b.Fatalf("stored position %d, want the end of the file %d", p.Offset, fi.Size())
	}
}

// BenchmarkRunDiscard: the real binary replays 200 000 records of 1 KiB
// into the discard handler, positions committed; start-up included.
func BenchmarkRunDiscard(b *testing.B) {
	const n = 200_000
	bin, dir := benchBinary(b), b.TempDir()
	benchStream(b, filepath.Join(dir, "orders.ss"), n, 1024)
	var total time.Duration
	var peak int64
	for b.Loop() {
		d, rss := runReplay(b, bin, dir, "[subscription.handler]\nkind = \"discard\"\n", 1)
		total += d
		peak = max(peak, rss)
		checkCommitted(b, dir)
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "records/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
}

// BenchmarkRunHTTP: the real binary replays 50 000 records of 100 bytes
// into the http handler with concurrency 32, against a local server.
func BenchmarkRunHTTP(b *testing.B) {
	const n = 50_000
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	bin, dir := benchBinary(b), b.TempDir()
	benchStream(b, filepath.Join(dir, "orders.ss"), n, 100)
	handler := fmt.Sprintf("[subscription.handler]\nkind = \"http\"\nurl = %q\n", srv.URL)
	var total time.Duration
	for b.Loop() {
		d, _ := runReplay(b, bin, dir, handler, 32)
		total += d
		checkCommitted(b, dir)
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "records/s")
}

// BenchmarkRunHTTPBatch: the real binary replays 500 000 records of 100
// bytes into the http handler in batches of 500 (concurrency 4), against a
// local net/http server answering 204, positions committed; and, in the
// same run, 50 000 of them one request per record at concurrency 32 as
// BenchmarkRunHTTP does, for the ratio of the two rates.
func BenchmarkRunHTTPBatch(b *testing.B) {
	const batched, single = 500_000, 50_000
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	bin := benchBinary(b)
	batchDir, singleDir := b.TempDir(), b.TempDir()
	benchStream(b, filepath.Join(batchDir, "orders.ss"), batched, 100)
	benchStream(b, filepath.Join(singleDir, "orders.ss"), single, 100)
	handler := fmt.Sprintf("[subscription.handler]\nkind = \"http\"\nurl = %q\n", srv.URL)
	var batchTime, singleTime time.Duration
	for b.Loop() {
		d, _ := runReplay(b, bin, batchDir, handler+"batch_max_records = 500\n", 4)
		batchTime += d
		checkCommitted(b, batchDir)
		d, _ = runReplay(b, bin, singleDir, handler, 32)
		singleTime += d
		checkCommitted(b, singleDir)
	}
	batchRate := float64(batched) * float64(b.N) / batchTime.Seconds()
	singleRate := float64(single) * float64(b.N) / singleTime.Seconds()
	b.ReportMetric(batchRate, "records/s")
	b.ReportMetric(singleRate, "single-records/s")
	b.ReportMetric(batchRate/singleRate, "x-single")
}

// BenchmarkHTTPClientFloor is the floor under BenchmarkRunHTTP: net/http
// alone, in a process of its own as the daemon is (this test binary run
// again as TestHTTPFloorClient), posting 50 000 bodies of 100 bytes from 32
// goroutines to the same kind of local server. What the daemon adds is the
// gap between the two.
func BenchmarkHTTPClientFloor(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	var total time.Duration
	for b.Loop() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHTTPFloorClient$")
		cmd.Env = append(os.Environ(), "STREAMD_FLOOR_URL="+srv.URL)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("floor client: %v\n%s", err, out)
		}
		total += time.Since(start)
	}
	b.ReportMetric(floorRequests*float64(b.N)/total.Seconds(), "requests/s")
}

const floorRequests = 50_000

// TestHTTPFloorClient is BenchmarkHTTPClientFloor's client process; it does
// nothing unless STREAMD_FLOOR_URL names the server.
func TestHTTPFloorClient(t *testing.T) {
	url := os.Getenv("STREAMD_FLOOR_URL")
	if url == "" {
		t.Skip("the client process of BenchmarkHTTPClientFloor")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 128
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := bytes.Repeat([]byte("x"), 100)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= floorRequests {
				resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// BenchmarkRunPendingRetries: 100 000 records of 1 KiB each answered with
// retry_after=1h, so that 100 000 copies wait in the durable spool; reports
// the daemon's peak RSS.
func BenchmarkRunPendingRetries(b *testing.B) {
	const n = 100_000
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Streamd-Outcome", "retry_after=1h")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	bin, dir := benchBinary(b), b.TempDir()
	benchStream(b, filepath.Join(dir, "orders.ss"), n, 1024)
	handler := fmt.Sprintf("[subscription.handler]\nkind = \"http\"\nurl = %q\n", srv.URL)
	var peak int64
	for b.Loop() {
		_, rss := runReplay(b, bin, dir, handler, 32)
		peak = max(peak, rss)
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
}
