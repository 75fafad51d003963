package tail

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// TestChainMiddleRetargetGrace: a symlink in the middle of a chain at the
// path (path -> mid/link -> data/a.ss), which no watch sees, retargeted to
// another file while the old one was quiet for longer than the grace: the
// poll finds it, and the follower goes on with the new file at once, not a
// whole RotationGrace after the poll.
func TestChainMiddleRetargetGrace(t *testing.T) {
	root := t.TempDir()
	streams, mid, data := filepath.Join(root, "streams"), filepath.Join(root, "mid"), filepath.Join(root, "data")
	for _, dir := range []string{streams, mid, data} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a, b := filepath.Join(data, "a.ss"), filepath.Join(data, "b.ss")
	writeFile(t, a, streamfile.Header{FileName: "a.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 1, 1, 20))
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(a, old, old); err != nil {
		t.Fatal(err)
	}
	link, path := filepath.Join(mid, "link"), filepath.Join(streams, "d.ss")
	relink(t, link, a)
	relink(t, path, link)

	const poll, grace = 3 * time.Second, 4 * time.Second
	waits := newWaitSignals()
	items, _ := startFollowing(t, Options{Path: path, PollInterval: poll, RotationGrace: grace, OnWait: waits.signal, Logger: testLogger(t)}, 1)
	// Retarget just as a wait begins after a poll found the path naming
	// a.ss: the next poll, a whole interval later, finds the retarget.
	waits.await(t, 2, 3*poll)

	fs := frames("k", 1, 1, 2, 20)
	writeFile(t, b, streamfile.Header{FileName: "b.ss", CreatedAtMs: 2, BeaconInterval: 1024}, fs)
	start := time.Now()
	relink(t, link, b)
	if err := sameFrames(collect(t, items, 1, poll+grace+5*time.Second), fs); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > poll+grace/2 {
		t.Errorf("the record of the new file came %v after the retarget, want within about the poll interval (%v), not the poll and the grace (%v)", took, poll, grace)
	}
}

// TestPolledRenameKeepsGrace: a plain path whose rotation only a poll
// finds (no notifications): the rotation may have come just before the
// poll, so the grace counts from the poll, and a record the producer
// writes to the renamed file within the grace after it is read, however
// long the file was quiet before.
func TestPolledRenameKeepsGrace(t *testing.T) {
	dir := t.TempDir()
	path, rotated := filepath.Join(dir, "d.ss"), filepath.Join(dir, "d.ss.1")
	writeFile(t, path, streamfile.Header{FileName: "d.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 1, 1, 20))
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	const poll, grace = 2 * time.Second, time.Second
	waits := newWaitSignals()
	items, _ := startFollowing(t, Options{Path: path, PollOnly: true, PollInterval: poll, RotationGrace: grace, OnWait: waits.signal, Logger: testLogger(t)}, 1)
	// Rotate just as a wait begins after a poll found the path naming the
	// file: the next poll, a whole interval later, finds the rotation,
	// and counting the grace from the poll before would leave the file at
	// once.
	waits.await(t, 2, 3*poll)
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, streamfile.Header{FileName: "d.ss", CreatedAtMs: 2, BeaconInterval: 1024}, nil)
	waits.await(t, 1, 3*poll) // after the poll that finds the rotation
	late := frames("k", 2, 1, 2, 20)
	appendFrames(t, rotated, late) // within the grace after the poll
	if err := sameFrames(collect(t, items, 1, poll+grace+5*time.Second), late); err != nil {
		t.Fatal(err)
	}
}

// waitSignals lets a test wait for a follower's next waits: its signal is
// the follower's OnWait.
type waitSignals chan struct{}

func newWaitSignals() waitSignals { return make(waitSignals, 64) }

func (w waitSignals) signal() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// await waits for n waits to begin, each within timeout.
func (w waitSignals) await(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	for range n {
		select {
		case <-w:
		case <-time.After(timeout):
			t.Fatal("the follower never waited")
		}
	}
}
