package tail

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// inotifyInstances counts the inotify instances this process holds.
func inotifyInstances(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.Contains(target, "inotify") {
			n++
		}
	}
	return n
}

// TestSharedWatcher: followers of several files of one directory that
// share a Watcher take one inotify instance between them, and each gets
// the notifications of its own file (the poll, an hour, never comes); one
// closed leaves the others notified, and the last closed leaves no watch.
func TestSharedWatcher(t *testing.T) {
	dir := t.TempDir()
	w := NewWatcher(testLogger(t))
	defer w.Close()
	before := inotifyInstances(t)
	const n = 5
	paths := make([]string, n)
	followers := make([]*Follower, n)
	items := make([]<-chan item, n)
	stops := make([]func(), n)
	for i := range n {
		paths[i] = filepath.Join(dir, fmt.Sprintf("s%d.ss", i))
		writeFile(t, paths[i], streamfile.Header{FileName: filepath.Base(paths[i]), CreatedAtMs: 1, BeaconInterval: 1024}, nil)
		fl, err := New(Options{Path: paths[i], PollInterval: time.Hour, Watcher: w, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		followers[i] = fl
		items[i], stops[i] = follow(t, fl)
	}
	waitFor(t, 5*time.Second, "the watch up", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.dirs) == 1 && w.dirs[dir].up && len(w.dirs[dir].watch) == n
	})
	if got := inotifyInstances(t) - before; got != 1 {
		t.Errorf("%d inotify instances for %d followers sharing a Watcher, want 1", got, n)
	}
	for i := range n {
		fs := frames(fmt.Sprintf("k%d", i), 1, 2, 1, 20)
		appendFrames(t, paths[i], fs)
		if err := sameFrames(collect(t, items[i], 2, 5*time.Second), fs); err != nil {
			t.Fatalf("follower %d: %v", i, err)
		}
	}
	for i := range n {
		noItem(t, items[i], 50*time.Millisecond, "another file's records")
	}

	stops[0]()
	if err := followers[0].Close(); err != nil {
		t.Fatal(err)
	}
	fs := frames("k1", 3, 1, 1, 20)
	appendFrames(t, paths[1], fs)
	if err := sameFrames(collect(t, items[1], 1, 5*time.Second), fs); err != nil {
		t.Fatalf("after another follower closed: %v", err)
	}
	for i, fl := range followers[1:] {
		stops[i+1]()
		if err := fl.Close(); err != nil {
			t.Fatal(err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.dirs) != 0 || len(w.targets) != 0 {
		t.Errorf("watches left after the last follower closed: %v, %v", w.dirs, w.targets)
	}
}
