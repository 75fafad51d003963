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
	waits := make(chan struct{}, 64)
	onWait := func() {
		select {
		case waits <- struct{}{}:
		default:
		}
	}
	items, _ := startFollowing(t, Options{Path: path, PollInterval: poll, RotationGrace: grace, OnWait: onWait, Logger: testLogger(t)}, 1)
	// Retarget just as a wait begins after a poll found the path naming
	// a.ss: the next poll, a whole interval later, finds the retarget.
	for range 2 {
		select {
		case <-waits:
		case <-time.After(3 * poll):
			t.Fatal("the follower never waited")
		}
	}

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
