package tail

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// TestSymlinkTargetNotified: appends to the file a symlink at the path
// names, in another directory, wake the follower as appends to a plain
// path do (the poll, an hour, never comes), also after the symlink is
// retargeted to a file in a third directory, and then to one beside it;
// the watch of a directory no target is in any more is dropped, and none
// is left once the follower is closed.
func TestSymlinkTargetNotified(t *testing.T) {
	root := t.TempDir()
	streams, a, b := filepath.Join(root, "streams"), filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, dir := range []string{streams, a, b} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(streams, "d.ss")
	retarget := func(to string) { relink(t, path, to) }
	file := func(dir string, n uint64) string {
		name := filepath.Join(dir, fmt.Sprintf("d-%d.ss", n))
		writeFile(t, name, streamfile.Header{FileName: filepath.Base(name), CreatedAtMs: n, BeaconInterval: 1024}, frames("k", 1, 1, n, 20))
		return name
	}
	first := file(a, 1)
	retarget("../a/d-1.ss")

	w := NewWatcher(testLogger(t))
	defer w.Close()
	var fl *Follower
	waiting := make(chan streamfile.Identity, 1024)
	onWait := func() { // on Next's goroutine: the watches are up for the file read
		select {
		case waiting <- fl.Position().File:
		default:
		}
	}
	fl, err := New(Options{Path: path, PollInterval: time.Hour, Watcher: w, OnWait: onWait, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	items, stop := follow(t, fl)
	closed := false
	defer func() {
		if !closed {
			stop()
			fl.Close()
		}
	}()

	// notified appends a record to name, once the follower waits in the
	// file it had from the start, and expects it well before a poll.
	seq := uint64(1)
	notified := func(name string, at got) {
		t.Helper()
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case id := <-waiting:
				if id == at.File {
					break wait
				}
			case <-deadline:
				t.Fatalf("%s: the follower never waited in it", name)
			}
		}
		seq++
		fs := frames("k", seq, 1, seq, 20)
		appendFrames(t, name, fs)
		if err := sameFrames(collect(t, items, 1, 5*time.Second), fs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	watched := func(want ...string) {
		t.Helper()
		w.mu.Lock()
		var dirs []string
		for dir := range w.dirs {
			dirs = append(dirs, dir)
		}
		w.mu.Unlock()
		list := w.fs.WatchList()
		slices.Sort(dirs)
		slices.Sort(list)
		slices.Sort(want)
		if !slices.Equal(dirs, want) || !slices.Equal(list, want) {
			t.Errorf("watched %v (inotify: %v), want %v", dirs, list, want)
		}
	}

	start := collect(t, items, 1, 5*time.Second)[0]
	notified(first, start)
	watched(streams, a)

	second := file(b, 2)
	retarget("../b/d-2.ss") // noticed by the watch of the path's directory
	at := collect(t, items, 1, 5*time.Second)[0]
	if at.File.FileName != "d-2.ss" {
		t.Fatalf("after the retarget, read %s, want the first record of d-2.ss", at)
	}
	notified(second, at)
	watched(streams, b)

	third := file(streams, 3)
	retarget("d-3.ss")
	at = collect(t, items, 1, 5*time.Second)[0]
	if at.File.FileName != "d-3.ss" {
		t.Fatalf("after the retarget, read %s, want the first record of d-3.ss", at)
	}
	notified(third, at)
	watched(streams)

	stop()
	closed = true
	if err := fl.Close(); err != nil {
		t.Fatal(err)
	}
	watched()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.targets) != 0 {
		t.Errorf("targets left after the follower closed: %v", w.targets)
	}
}

// TestSymlinkTargetNoPollRead: records appended to the file a symlink at
// the path names come by notification, so none is counted as found by a
// poll (streamd_poll_reads_total), as for a plain path.
func TestSymlinkTargetNoPollRead(t *testing.T) {
	root := t.TempDir()
	streams, a := filepath.Join(root, "streams"), filepath.Join(root, "a")
	for _, dir := range []string{streams, a} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	target, path := filepath.Join(a, "d-1.ss"), filepath.Join(streams, "d.ss")
	writeFile(t, target, streamfile.Header{FileName: "d-1.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 1, 1, 20))
	if err := os.Symlink("../a/d-1.ss", path); err != nil {
		t.Fatal(err)
	}
	obs := newObserver()
	items, _ := startFollowing(t, Options{Path: path, PollInterval: 500 * time.Millisecond, Observer: obs, Logger: testLogger(t)}, 1)
	for seq := uint64(2); seq <= 4; seq++ {
		fs := frames("k", seq, 1, seq, 20)
		appendFrames(t, target, fs)
		if err := sameFrames(collect(t, items, 1, 5*time.Second), fs); err != nil {
			t.Fatal(err)
		}
	}
	if n := obs.count(EventPollRead); n != 0 {
		t.Errorf("%d records found by a poll, want none: %s", n, obs)
	}
}
