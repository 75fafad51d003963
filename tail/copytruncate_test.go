package tail

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// copytruncate does what logrotate's copytruncate does to the file at path:
// it copies it to path.1 (a new inode, dated an hour before the grace, so
// that the copy is left once read), then truncates it; a writer then
// starts it over with a new header, unless stopped is set.
func copytruncate(t *testing.T, path string, written bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".1", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path+".1", time.Time{}, time.Now().Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if written {
		writeFile(t, path, lastHeader, copyRepl)
	}
}

// copyRepl are the frames written into the truncated file.
var copyRepl = frames("new", 1, 5, 1, 20)

// TestCopytruncate: a file that logrotate's copytruncate truncated after
// copying it is read on in the copy, from where the follower was, to the
// copy's end, then from the beginning of the file at the path: nothing is
// lost, nothing read twice, and no loss is logged. Whether the follower
// followed the file then, or started after it (stored position) with the
// file written again or still empty, or with every record of the file read
// before it was copied.
func TestCopytruncate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		stopped, written bool
		read             int // records read before the copy; 0: all
	}{
		{"while following", false, true, 8},
		{"while stopped", true, true, 8},
		{"while stopped, not written again yet", true, false, 8},
		{"while stopped, read to its end", true, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "r.ss")
			old := frames("old", 1, 200, 1, 60)
			writeFile(t, path, oldHeader, old)
			var log testutil.SyncBuffer
			obs := newObserver()
			opts := Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: time.Hour,
				Observer: obs, Logger: slog.New(slog.NewTextHandler(&log, nil))}
			fl, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.read == 0 {
				tc.read = len(old)
			}
			first := nextN(t, fl, tc.read, new(int))
			if tc.stopped {
				stored := fl.Position()
				fl.Close()
				copytruncate(t, path, tc.written)
				opts.Resume = &stored
				if fl, err = New(opts); err != nil {
					t.Fatal(err)
				}
			} else {
				copytruncate(t, path, tc.written)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			rest := collect(t, items, len(old)-tc.read, 10*time.Second)
			if !tc.written {
				writeFile(t, path, lastHeader, copyRepl)
			}
			rest = append(rest, collect(t, items, len(copyRepl), 10*time.Second)...)
			if err := sameFrames(append(first, rest...), append(old[:len(old):len(old)], copyRepl...)); err != nil {
				t.Fatalf("%v\nlog:\n%s", err, log.String())
			}
			select {
			case it := <-items:
				t.Fatalf("after every record, another: %+v", it)
			case <-time.After(200 * time.Millisecond): // a few polls
			}
			if strings.Contains(log.String(), "level=ERROR") || obs.count(EventTruncated) != 0 {
				t.Errorf("a loss logged or counted (%d truncations):\n%s", obs.count(EventTruncated), log.String())
			}
			if !strings.Contains(log.String(), "copy_path="+path+".1") {
				t.Errorf("the copy is not named in the log:\n%s", log.String())
			}
		})
	}
}

// TestCopytruncateCatchingUp: the file is truncated and written anew with
// frames of other sizes while the follower catches up on a backlog, reading
// without a wake-up in between: the record a read finds in the new bytes
// is dropped, and the copy is read from where that record started, so
// that none is lost; and the records from the copy carry its identity,
// where their offsets are.
func TestCopytruncateCatchingUp(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r.ss")
	old := frames("old", 1, 4000, 1, 60)
	writeFile(t, path, oldHeader, old)
	var log testutil.SyncBuffer
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: time.Hour, Observer: obs,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	first := nextN(t, fl, 1, new(int))
	copytruncate(t, path, false)
	repl := frames("new", 1, 4000, 1, 97)
	writeFile(t, path, lastHeader, repl)
	copied, err := os.Stat(path + ".1")
	if err != nil {
		t.Fatal(err)
	}
	items, stop := follow(t, fl)
	defer stop()
	rest := collect(t, items, len(old)-1+len(repl), 20*time.Second)
	all := append(first, rest...)
	if err := sameFrames(all, append(old[:len(old):len(old)], repl...)); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, log.String())
	}
	if f := all[len(old)-1].File; f.Ino != streamfile.Inode(copied) {
		t.Errorf("the last record of the copy names the file %+v, want the copy's inode %d", f, streamfile.Inode(copied))
	}
	if obs.count(EventTruncated) != 0 || strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("a loss logged or counted:\n%s", log.String())
	}
}

// TestCopytruncateShortCopy: records appended to the file after the copy
// was made (before the truncation: logrotate's window) are in neither
// file: the copy is read, and the bytes the follower saw past its end are
// logged at ERROR and counted.
func TestCopytruncateShortCopy(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "r.ss")
	old := frames("old", 1, 200, 1, 60)
	writeFile(t, path, oldHeader, old[:100])
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".1", b, 0o644); err != nil {
		t.Fatal(err)
	}
	appendFrames(t, path, old[100:])
	var log testutil.SyncBuffer
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: 50 * time.Millisecond, Observer: obs,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	first := nextN(t, fl, 8, new(int))
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, lastHeader, copyRepl)
	items, stop := follow(t, fl)
	defer stop()
	rest := collect(t, items, 92+len(copyRepl), 10*time.Second)
	if err := sameFrames(append(first, rest...), append(old[:100:100], copyRepl...)); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, log.String())
	}
	if obs.count(EventTruncated) != 1 || obs.count(EventLost) != 1 || !strings.Contains(log.String(), "unread_bytes_at_least") {
		t.Errorf("%d truncations and %d losses counted, want 1 each with the loss logged:\n%s", obs.count(EventTruncated), obs.count(EventLost), log.String())
	}
}
