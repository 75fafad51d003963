package tail

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// hangingFile blocks every ReadAt while hang is set, until release is
// closed: a read stuck in a hung disk or network file system.
type hangingFile struct {
	*os.File
	hang    *atomic.Bool
	release chan struct{}
}

func (f hangingFile) ReadAt(p []byte, off int64) (int, error) {
	if f.hang.Load() {
		<-f.release
	}
	return f.File.ReadAt(p, off)
}

// TestStalled checks that Stalled is 0 while Next waits for the file to
// grow and grows while a read inside Next hangs, then falls back to 0.
func TestStalled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	first, second := frames("k", 1, 3, 1, 20), frames("k", 4, 3, 1, 20)
	writeFile(t, path, streamfile.Header{FileName: "s.ss", CreatedAtMs: 1, BeaconInterval: 1024}, first)
	var hang atomic.Bool
	release := make(chan struct{})
	hooks := testHooks{open: func(name string) (file, error) {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		return hangingFile{File: f, hang: &hang, release: release}, nil
	}}
	// No poll: its look at the file, a read too, could be under way when
	// the test asks while Next waits.
	fl, err := newFollower(Options{Path: path, PollInterval: time.Hour, Logger: testLogger(t)}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if d := fl.Stalled(); d != 0 {
		t.Errorf("Stalled() = %s before Next, want 0", d)
	}
	items, stop := follow(t, fl)
	defer stop()
	if err := sameFrames(collect(t, items, len(first), 5*time.Second), first); err != nil {
		t.Fatal(err)
	}
	// Waiting for growth is not a stall, however long it lasts.
	waitFor(t, 5*time.Second, "Next to wait with Stalled() = 0", func() bool { return fl.Stalled() == 0 })
	noItem(t, items, 100*time.Millisecond, "before the file grows")
	if d := fl.Stalled(); d != 0 {
		t.Errorf("Stalled() = %s while Next waits, want 0", d)
	}

	hang.Store(true)
	appendFrames(t, path, second)
	waitFor(t, 5*time.Second, "a hung read to show as a stall", func() bool { return fl.Stalled() > 100*time.Millisecond })

	hang.Store(false)
	close(release)
	if err := sameFrames(collect(t, items, len(second), 5*time.Second), second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "Stalled() back to 0", func() bool { return fl.Stalled() == 0 })
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
