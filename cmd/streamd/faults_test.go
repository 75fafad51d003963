package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
)

// mountTmpfs mounts a tmpfs of the given size at dir, or skips the test
// saying why it cannot.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs for a full disk needs root")
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s)", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
}

// smallStateDisk mounts a 128 KiB filesystem as e's state directory, and
// returns its path.
func smallStateDisk(t *testing.T, e *env) string {
	t.Helper()
	state := filepath.Join(e.dir, "state")
	os.Mkdir(state, 0o755)
	mountTmpfs(t, state, "128k")
	return state
}

// fillDisk fills the filesystem of dir with a file, and returns the
// function that removes it, giving the room back.
func fillDisk(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	filler, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	for {
		if _, err := filler.Write(make([]byte, 1024)); err != nil {
			return func() { os.Remove(path) } // the disk is full
		}
	}
}

// TestFaultFullStreamDisk fills the filesystem of the stream file while the
// daemon appends retry copies: no position moves past a record whose copy
// was not written, the error is logged clearly, and once space returns
// every copy is written and the file is whole.
func TestFaultFullStreamDisk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry_after=0s; fi`))
	streams := filepath.Join(e.dir, "streams")
	os.Mkdir(streams, 0o755)
	mountTmpfs(t, streams, "64k")
	e.stream = filepath.Join(streams, "orders.ss")
	cfg, _ := os.ReadFile(e.config)
	os.WriteFile(e.config, []byte(strings.Replace(string(cfg), filepath.Join(e.dir, "orders.ss"), e.stream, 1)), 0o644)

	// Fill most of the filesystem with 1 KiB records: their copies do not
	// all fit.
	w, err := streamfile.OpenWriter(e.stream, streamfile.CreateOptions{Create: true,
		Header: streamfile.Header{FileName: "orders.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		p := fmt.Sprintf("%04d%s", i, strings.Repeat("x", 1000))
		if err := w.Publish([]streamfile.Frame{{Key: "orders", TimestampMs: 1, Payload: []byte(p)}}); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	w.Close()

	p := e.start()
	eventually(t, 20*time.Second, "the full disk to be reported", func() bool {
		return strings.Contains(p.stderr.String(), "no space left on device")
	})
	if !strings.Contains(p.stderr.String(), "the record stays unsettled") {
		t.Errorf("the log does not say the record stays unsettled:\n%s", p.stderr.String())
	}
	// Invariant 1: the stored position never passes a record whose copy
	// is not in the file. Record i's copy is written before i settles, one
	// record at a time, so the commits (every 100ms) catch up with the
	// copies written and stop there: checked at each look until they have.
	// The sidecar is read first: copies only grow.
	var copies int
	eventually(t, 10*time.Second, "the stored position to reach the last record whose copy was written", func() bool {
		stored, err := offsets.Load(filepath.Join(e.dir, "state"))
		if err != nil {
			t.Fatal(err)
		}
		copies = countCopies(t, e.stream)
		last := stored["billing"].LastSeq
		if last > uint64(copies) {
			t.Fatalf("stored position after seq %d, but only %d copies are in the file", last, copies)
		}
		return last == uint64(copies)
	})
	if copies >= n {
		t.Fatalf("all %d copies fit: the disk never filled", copies)
	}

	// Space returns: every copy is written, and the file is whole.
	if out, err := exec.Command("mount", "-o", "remount,size=8m", streams).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	eventually(t, 30*time.Second, "every copy", func() bool { return countCopies(t, e.stream) == n })
	eventually(t, 30*time.Second, "every record and copy delivered", func() bool { return len(e.deliveries()) >= 2*n })
	eventually(t, 10*time.Second, "the end of the file to be committed", committedAtEnd(e, "billing"))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	readFile(t, e.stream) // decodes whole, beacons well placed
	if pos := storedPosition(t, e, "billing"); pos.Offset != fileSize(t, e.stream) {
		t.Fatalf("stored offset %d after the stop, want the end of the file %d", pos.Offset, fileSize(t, e.stream))
	}
}

// TestFaultFullStreamDiskDelayedCopy: a delayed copy that comes due while
// the stream file's filesystem is full stays in the spool and is reported
// as an immediate copy is, in streamd_copy_errors_total and on /healthz,
// until space returns and it is written.
func TestFaultFullStreamDiskDelayedCopy(t *testing.T) {
	t.Parallel()
	// The handler waits for the test to fill the disk, then asks for the
	// copy in 100ms.
	e := newEnv(t, execSub("billing", "", `while [ ! -e LOG.go ]; do sleep 0.02; done; if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=100ms; fi`))
	addr := e.withMetrics()
	streams := filepath.Join(e.dir, "streams")
	os.Mkdir(streams, 0o755)
	mountTmpfs(t, streams, "64k")
	e.editConfig(filepath.Join(e.dir, "orders.ss"), filepath.Join(streams, "orders.ss"))
	e.stream = filepath.Join(streams, "orders.ss")
	e.publish(strings.Repeat("x", 8000)) // its copy needs pages of its own
	p := e.start()
	eventually(t, 10*time.Second, "the handler to have the record", func() bool { return len(e.deliveries()) == 1 })
	free := fillDisk(t, streams)
	if err := os.WriteFile(e.log+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const problem = `delayed copies of stream "orders": a due one cannot be written and stays in the spool, tried again`
	eventually(t, 10*time.Second, "/healthz to report the delayed copy", func() bool {
		code, body := healthz(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, problem) && strings.Contains(body, "no space left on device")
	})
	if n := scrapeMetric(t, addr, "streamd_copy_errors_total", "billing"); n < 1 {
		t.Errorf("streamd_copy_errors_total %v, want the failed copy counted", n)
	}
	free()
	eventually(t, 20*time.Second, "the copy to be written and /healthz to turn 200", func() bool {
		code, _ := healthz(addr)
		return code == http.StatusOK && countCopies(t, e.stream) == 1
	})
	eventually(t, 5*time.Second, "the log to say so", func() bool {
		return strings.Contains(p.stderr.String(), "writing delayed copies works again")
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// TestFaultFullStateDiskAtStart: a daemon started while the filesystem of
// its state directory is full runs (a restart during the incident must
// not stop the records), delivers, and commits once space returns; then
// its lock file names it, for streamd reload.
func TestFaultFullStateDiskAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", ""))
	state := smallStateDisk(t, e)
	e.publish("first")
	p := e.start()
	eventually(t, 10*time.Second, "the first record to be committed", committedThrough(state, "billing", 1))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	free := fillDisk(t, state)
	e.publish("second")
	p = e.start()
	eventually(t, 10*time.Second, "the record published while it was stopped", func() bool { return len(e.deliveries()) == 2 })
	if r := runBinary(t, nil, "reload", "--config.file="+e.config); r.code != exitError || !strings.Contains(r.stderr, "names no process") {
		t.Errorf("reload while the PID is not written: exit %d, stderr %q", r.code, r.stderr)
	}
	free()
	eventually(t, 10*time.Second, "the position to be committed after space returned", committedThrough(state, "billing", 2))
	// The PID is written at a commit: the one above, or the next.
	eventually(t, 10*time.Second, "streamd reload to find the daemon", func() bool {
		return runBinary(t, nil, "reload", "--config.file="+e.config).code == exitOK
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// countCopies counts the retry copies (count 1) in the stream file, reading
// only its complete frames.
func countCopies(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		t.Fatal(err)
	}
	d := streamfile.NewDecoder(f, h, streamfile.HeaderSize)
	n := 0
	for {
		r, err := d.Next()
		if err != nil {
			return n
		}
		if hd, _ := envelope.Decode(r.Payload); envelope.RetryCount(hd) == 1 {
			n++
		}
	}
}

// TestFaultFullStateDisk fills the filesystem of the state directory while
// records ask for delayed retries: a copy that cannot be spooled leaves its
// record unsettled, the sidecar keeps its last good commit, and once space
// returns the copies are spooled and the positions committed.
func TestFaultFullStateDisk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", `backoff = ["200ms"]`, `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=1h; fi`))
	addr := e.withMetrics()
	state := smallStateDisk(t, e)
	e.publish("first")
	p := e.start()
	eventually(t, 10*time.Second, "the first record to be spooled and committed", committedThrough(state, "billing", 1))
	free := fillDisk(t, state)
	big := strings.Repeat("y", 4000)
	e.publish("a"+big, "b"+big, "c"+big)
	eventually(t, 20*time.Second, "the full disk to be reported", func() bool {
		return strings.Contains(p.stderr.String(), "no space left on device")
	})
	// Three failed tries of the copy, a backoff (200ms) apart: the commits
	// (every 100ms) had their chances.
	eventually(t, 10*time.Second, "the copy to fail three times", func() bool {
		return scrapeMetric(t, addr, "streamd_copy_errors_total", "billing") >= 3
	})
	if s, err := offsets.Load(state); err != nil || s["billing"].LastSeq != 1 {
		t.Fatalf("with the state disk full: sidecar %+v, %v; want it still after record 1", s["billing"], err)
	}
	// The daemon answers a reload in the place of its last answer.
	if r := runBinary(t, nil, "reload", "--config.file="+e.config, "--timeout=10s"); r.code != exitOK || !strings.Contains(r.stdout, "runs the new configuration") {
		t.Errorf("reload with the state disk full: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	free()
	eventually(t, 20*time.Second, "the positions to be committed after space returned", committedThrough(state, "billing", 4))
	if n := metricValue(t, addr, `streamd_handler_records_total{outcome="retry_after",subscription="billing"}`); n != 4 {
		t.Errorf("%v answers retry_after counted, want 4: one per answer, however often its copy was tried", n)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); len(got) != 4 {
		t.Fatalf("deliveries %q: want each record once (their copies wait an hour)", got)
	}
}
