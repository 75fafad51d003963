package daemon

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRunNamedPipeAtPath: a named pipe put at the stream path while the
// daemon runs (no writer ever opens it) is refused by every reader of the
// path without waiting on it: the subscription's follower logs it as a
// replacement it cannot open, and the subscription is unhealthy, saying
// so; the stream's size is looked at (the pipe's, 0), a graceful stop
// finishes, and streamd offsets show says what is at the path.
func TestRunNamedPipeAtPath(t *testing.T) {
	t.Parallel()
	e, r, _ := startDelivered(t)
	size := func() float64 { return testutil.ToFloat64(r.d.metrics.Stream("orders").Size) }
	waitFor(t, "the stream's size", func() bool { return size() > 0 })

	if err := os.Rename(e.stream, e.stream+".keep"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(e.stream, 0o644); err != nil {
		t.Fatal(err)
	}
	// Before the daemon's cleanup, which waits for Run: without the fix,
	// a reader blocked opening the pipe would keep Run from returning.
	t.Cleanup(func() { releaseReaders(e.stream) })

	const unopenable = "stream file replaced by a file that cannot be opened; its records wait, and it is tried again at each notification and poll"
	waitFor(t, "the follower to refuse the named pipe", func() bool { return len(r.logs.with(unopenable)) > 0 })
	if got := r.logs.with(unopenable)[0].attrs["err"]; !strings.Contains(got, e.stream+" is not a regular file (p") {
		t.Errorf("the follower's error %q does not say the path is a named pipe", got)
	}
	waitFor(t, "the subscription to be unhealthy", func() bool {
		err := r.d.metrics.Health().Err()
		return err != nil && strings.Contains(err.Error(), `subscription "billing": waiting for its stream file`) && strings.Contains(err.Error(), e.stream+" is not a regular file (p")
	})
	// The size is the pipe's once it was looked at. An open of the pipe
	// that waited for a writer would never look, and would keep the stop
	// from finishing: the stop says so.
	deadline := time.Now().Add(10 * time.Second)
	for size() != 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of the stop with a named pipe at the stream path")
	}
	if size() != 0 {
		t.Errorf("stream size %v, want the named pipe's, 0", size())
	}

	reports := make(chan []PositionReport, 1)
	go func() {
		got, err := Positions(e.load())
		if err != nil {
			t.Error(err)
		}
		reports <- got
	}()
	select {
	case got := <-reports:
		if len(got) != 1 || got[0].FileSize != -1 || !strings.Contains(got[0].Note, e.stream+" is not a regular file (p") {
			t.Errorf("offsets show reports %+v; want no size, and a note that the path is a named pipe", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Positions did not return within 10 s with a named pipe at the stream path")
	}
}

// releaseReaders lets a reader blocked opening the named pipe at path go
// on: a writer opens it (at once, whether or not a reader waits: without
// one, the open fails and nothing waits), the pipe is removed, so that no
// later open waits on it, and then the writer closes it.
func releaseReaders(path string) {
	w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	os.Remove(path)
	if err == nil {
		w.Close()
	}
}
