package tail

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// noItem fails the test if the follower hands out anything within d.
func noItem(t *testing.T, items <-chan item, d time.Duration, what string) {
	t.Helper()
	select {
	case it := <-items:
		t.Fatalf("%s: Next returned %v, %v; want it to wait", what, it.rec, it.err)
	case <-time.After(d):
	}
}

// TestUnopenableReplacement replaces the followed file by one the follower
// cannot open: the records of the old file are all delivered, the follower
// neither fails nor skips anything, counts the replacement once, logs the
// error and tells it as a trouble once however often it tries again, and
// once the file can be opened it reads it from its beginning by itself,
// telling the trouble's end.
func TestUnopenableReplacement(t *testing.T) {
	t.Parallel()
	const unopenable = "stream file replaced by a file that cannot be opened"
	tests := []struct {
		name string
		// replace puts something the follower cannot open at path, made
		// of the new file's content at tmp where that applies.
		replace func(t *testing.T, path, tmp string, deny *atomic.Bool)
		// repair makes the new file at tmp the readable file at path.
		repair func(t *testing.T, path, tmp string, deny *atomic.Bool)
		err    string
		// replaced is the replacement events in all: a repair that puts
		// another file at the path makes it a replacement of its own.
		replaced int
	}{
		{
			name: "permission denied",
			replace: func(t *testing.T, path, tmp string, deny *atomic.Bool) {
				deny.Store(true)
				if err := os.Rename(tmp, path); err != nil {
					t.Fatal(err)
				}
			},
			// Nothing changes on disk: only the poll finds it readable.
			repair:   func(t *testing.T, path, tmp string, deny *atomic.Bool) { deny.Store(false) },
			err:      "permission denied",
			replaced: 1,
		},
		{
			name: "directory",
			replace: func(t *testing.T, path, tmp string, deny *atomic.Bool) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
			},
			repair:   renameOverNonFile,
			err:      ": is a directory",
			replaced: 2,
		},
		{
			// Opening a FIFO would block until a writer came: the
			// follower must not even try.
			name: "fifo",
			replace: func(t *testing.T, path, tmp string, deny *atomic.Bool) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := syscall.Mkfifo(path, 0o644); err != nil {
					t.Skipf("mkfifo: %v", err)
				}
			},
			repair:   renameOverNonFile,
			err:      "is not a regular file (p",
			replaced: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path, tmp := filepath.Join(dir, "r.ss"), filepath.Join(dir, "new.ss")
			old, repl := frames("old", 1, 10, 1, 50), frames("new", 1, 5, 1, 30)
			writeFile(t, path, oldHeader, old)
			writeFile(t, tmp, newHeader, repl)
			var deny atomic.Bool
			hooks := testHooks{open: func(name string) (file, error) {
				if deny.Load() {
					return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EACCES}
				}
				return openFile(name)
			}}
			var logs testutil.SyncBuffer
			obs := newObserver()
			fl, err := newFollower(Options{Path: path, PollInterval: 50 * time.Millisecond, Observer: obs,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))}, hooks)
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			if err := sameFrames(collect(t, items, len(old), 5*time.Second), old); err != nil {
				t.Fatal(err)
			}

			tt.replace(t, path, tmp, &deny)
			// About ten polls, each of which tries again.
			noItem(t, items, 600*time.Millisecond, "while the file at the path cannot be opened")
			if n := obs.count(EventReplaced); n != 1 {
				t.Errorf("%d replacement events while it cannot be opened, want 1", n)
			}
			if n := strings.Count(logs.String(), unopenable); n != 1 {
				t.Errorf("%d log lines %q, want 1 (rate-limited); log:\n%s", n, unopenable, logs.String())
			}
			if !strings.Contains(logs.String(), tt.err) || !strings.Contains(logs.String(), "path="+path) {
				t.Errorf("the log does not name the path and the error %q:\n%s", tt.err, logs.String())
			}
			if told := obs.told(); len(told) != 1 || !strings.Contains(told[0], tt.err) || !strings.Contains(told[0], path) {
				t.Errorf("troubles told %q, want one naming the path and the error %q", told, tt.err)
			}

			tt.repair(t, path, tmp, &deny)
			if err := sameFrames(collect(t, items, len(repl), 5*time.Second), repl); err != nil {
				t.Fatal(err)
			}
			noItem(t, items, 200*time.Millisecond, "after the new file was read")
			if told := obs.told(); len(told) != 2 || told[1] != "" {
				t.Errorf("troubles told %q, want the one, then its end", told)
			}
			if n := obs.count(EventReplaced); n != tt.replaced {
				t.Errorf("%d replacement events in all, want %d", n, tt.replaced)
			}
			if !strings.Contains(logs.String(), "can be opened now") && !strings.Contains(logs.String(), "gone from the path") {
				t.Errorf("the log does not say the trouble passed:\n%s", logs.String())
			}
		})
	}
}

// renameOverNonFile removes what is at path and renames the stream file at
// tmp there.
func renameOverNonFile(t *testing.T, path, tmp string, _ *atomic.Bool) {
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// flakyFile fails every read with EIO while fail is set. It looks at fail
// after reading: a read that began before fail was set and saw bytes
// written after it fails too.
type flakyFile struct {
	*os.File
	fail *atomic.Bool
}

func (f flakyFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if f.fail.Load() {
		return 0, &fs.PathError{Op: "read", Path: f.Name(), Err: syscall.EIO}
	}
	return n, err
}

// TestReadErrorRetried makes reads of the open file fail with EIO: a live
// follower waits it out and reads on at the same offset, nothing skipped or
// repeated, logging the error once and its end once, and telling them as a
// trouble; a replay fails with it.
func TestReadErrorRetried(t *testing.T) {
	open := func(fail *atomic.Bool) testHooks {
		return testHooks{open: func(name string) (file, error) {
			f, err := os.Open(name)
			if err != nil {
				return nil, err
			}
			return flakyFile{f, fail}, nil
		}}
	}
	// followRead follows opts.Path, whose reads fail while the returned
	// flag is set, and reads its first records, read.
	followRead := func(t *testing.T, opts Options, read []streamfile.Frame) (<-chan item, *atomic.Bool) {
		t.Helper()
		fail := new(atomic.Bool)
		fl, err := newFollower(opts, open(fail))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fl.Close() })
		items, stop := follow(t, fl)
		t.Cleanup(stop)
		if err := sameFrames(collect(t, items, len(read), 5*time.Second), read); err != nil {
			t.Fatal(err)
		}
		return items, fail
	}
	t.Run("live", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "r.ss")
		fs := frames("k", 1, 20, 1, 40)
		writeFile(t, path, oldHeader, fs[:10])
		var logs testutil.SyncBuffer
		obs := newObserver()
		items, fail := followRead(t, Options{Path: path, PollInterval: 50 * time.Millisecond, Observer: obs,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}, fs[:10])
		fail.Store(true)
		appendFrames(t, path, fs[10:])
		noItem(t, items, 500*time.Millisecond, "while reads fail")
		const msg = "cannot read the stream file; trying again at the same offset"
		if n := strings.Count(logs.String(), msg); n != 1 {
			t.Errorf("%d log lines %q, want 1 (rate-limited); log:\n%s", n, msg, logs.String())
		}
		if n := obs.count(EventUnreadable); n != 1 {
			t.Errorf("%d unreadable events, want 1 for the spell of failures", n)
		}
		if !strings.Contains(logs.String(), "input/output error") {
			t.Errorf("the log does not give the error:\n%s", logs.String())
		}
		if told := obs.told(); len(told) != 1 || !strings.Contains(told[0], "input/output error") {
			t.Errorf("troubles told %q, want the read error once", told)
		}
		fail.Store(false)
		if err := sameFrames(collect(t, items, 10, 5*time.Second), fs[10:]); err != nil {
			t.Fatal(err)
		}
		noItem(t, items, 200*time.Millisecond, "after the rest was read")
		if told := obs.told(); len(told) != 2 || told[1] != "" {
			t.Errorf("troubles told %q, want the read error, then its end", told)
		}
		if !strings.Contains(logs.String(), "stream file can be read again") {
			t.Errorf("the log does not say reading works again:\n%s", logs.String())
		}
	})
	t.Run("live, quiet after", func(t *testing.T) {
		// The read error passes on a stream with no whole frame to read
		// after it (a torn one here): its end is told all the same.
		dir := t.TempDir()
		path := filepath.Join(dir, "r.ss")
		fs := frames("k", 1, 11, 1, 40)
		writeFile(t, path, oldHeader, fs[:10])
		whole := filepath.Join(dir, "whole.ss")
		writeFile(t, whole, oldHeader, fs)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		after, err := os.ReadFile(whole)
		if err != nil {
			t.Fatal(err)
		}
		obs := newObserver()
		_, fail := followRead(t, Options{Path: path, PollInterval: 50 * time.Millisecond, Observer: obs, Logger: testLogger(t)}, fs[:10])
		fail.Store(true)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		torn := after[len(before) : len(before)+(len(after)-len(before))/2]
		if _, err := f.Write(torn); err != nil {
			t.Fatal(err)
		}
		f.Close()
		waitFor(t, 5*time.Second, "the read error told", func() bool { return len(obs.told()) == 1 })
		fail.Store(false)
		waitFor(t, 5*time.Second, "its end told", func() bool { told := obs.told(); return len(told) == 2 && told[1] == "" })
	})
	t.Run("replay", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "r.ss")
		writeFile(t, path, oldHeader, frames("k", 1, 3, 1, 40))
		var fail atomic.Bool
		fl, err := newFollower(Options{Path: path, Replay: true}, open(&fail))
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		fail.Store(true)
		_, err = fl.Next(context.Background())
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("Next = %v, want the EIO", err)
		}
	})
}
