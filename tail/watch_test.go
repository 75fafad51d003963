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
	if len(w.dirs) != 0 || len(w.targets) != 0 || len(w.fs.WatchList()) != 0 {
		t.Errorf("watches left after the last follower closed: %v, %v, %v", w.dirs, w.targets, w.fs.WatchList())
	}
}

// TestSharedWatcherAliasedDir: a directory reached by two paths (a symlink
// to it) is watched for the followers of both, which one inotify
// instance, naming its events by the first path, could not do.
func TestSharedWatcherAliasedDir(t *testing.T) {
	root := t.TempDir()
	real, link := filepath.Join(root, "real"), filepath.Join(root, "link")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(testLogger(t))
	defer w.Close()
	paths := []string{filepath.Join(real, "a.ss"), filepath.Join(link, "b.ss")}
	items := make([]<-chan item, len(paths))
	for i, path := range paths {
		writeFile(t, path, streamfile.Header{FileName: filepath.Base(path), CreatedAtMs: 1, BeaconInterval: 1024}, nil)
		fl, err := New(Options{Path: path, PollInterval: time.Hour, Watcher: w, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var stop func()
		items[i], stop = follow(t, fl)
		defer fl.Close()
		defer stop()
	}
	// Until a watch is up, appends go unnoticed (the poll, an hour, never
	// comes): append until one is notified, to each file in turn, then to
	// each again, once both followers are up.
	for range 2 {
		for i, path := range paths {
			appendUntilNotified(t, path, items[i])
		}
	}
}

// appendUntilNotified appends records to path until the follower whose
// items they are gets one within 100 ms (its poll, an hour, never comes:
// until its watch is up, appends go unnoticed), in 5 s at most. The first
// call may be answered by the follower's first look at the file: only a
// later one shows a notification.
func appendUntilNotified(t *testing.T, path string, items <-chan item) {
	t.Helper()
	for seq := uint64(1); seq <= 50; seq++ {
		appendFrames(t, path, frames("k", seq, 1, 1, 20))
		select {
		case it := <-items:
			if it.err != nil {
				t.Fatalf("%s: %v", path, it.err)
			}
			for len(items) > 0 { // the rest of the appends, notified too
				<-items
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("%s: no record notified in 5 s", path)
}

// TestSharedWatcherRetargetedDir: a follower whose path goes through a
// symlink to a directory retargeted since the watch of that path was put
// up is notified of its own directory all the same.
func TestSharedWatcherRetargetedDir(t *testing.T) {
	root := t.TempDir()
	a, b, link := filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "link")
	for _, dir := range []string{a, b} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(a, link); err != nil {
		t.Fatal(err)
	}
	w := NewWatcher(testLogger(t))
	defer w.Close()
	follower := func(path string) <-chan item {
		writeFile(t, path, streamfile.Header{FileName: filepath.Base(path), CreatedAtMs: 1, BeaconInterval: 1024}, nil)
		fl, err := New(Options{Path: path, PollInterval: time.Hour, Watcher: w, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		items, stop := follow(t, fl)
		t.Cleanup(func() { stop(); fl.Close() })
		return items
	}
	first := filepath.Join(link, "s.ss")
	appendUntilNotified(t, first, follower(first))
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(b, link); err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(link, "t.ss")
	items := follower(second)
	for range 2 { // the first may be read when the follower starts
		appendUntilNotified(t, second, items)
	}
}
