package tail

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// TestResumeRotated: a position stored in a file that a rotation renamed
// while nothing followed it (streamd stopped) resumes in that file when it
// is still in the directory of the path (under another name, or where the
// path's symlink points): the rest of it is read, then the new file at the
// path from its beginning. A file rotated out of the directory (or gone)
// cannot be found: the new file is read from its beginning, and the loss
// is logged at ERROR, unless the follower before held it open and handed
// it over (Options.Held). A file rotated after the one resumed in, before
// the one at the path, is read between them.
func TestResumeRotated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// rotate renames the file followed at path (data/r.ss, or the link
		// r.ss to it) away, and returns where it went.
		rotate  func(t *testing.T, dir string) string
		found   bool
		symlink bool
		between bool // a file rotated after the stored position's: data/r.ss.1, frames of between
		held    bool // the follower before hands over the file it read (Hold)
	}{
		{"renamed in the directory", func(t *testing.T, dir string) string { return rename(t, dir, "data/r.ss", "data/r.ss.1") }, true, false, false, false},
		{"renamed where the symlink points", func(t *testing.T, dir string) string { return rename(t, dir, "data/r.ss", "data/r.ss.1") }, true, true, false, false},
		{"moved to another directory", func(t *testing.T, dir string) string { return rename(t, dir, "data/r.ss", "old/r.ss.1") }, false, false, false, false},
		{"removed", remove, false, false, false, false},
		{"removed, held open", remove, true, false, false, true},
		{"renamed, held open", func(t *testing.T, dir string) string { return rename(t, dir, "data/r.ss", "data/r.ss.1") }, true, false, false, true},
		{"rotated twice", func(t *testing.T, dir string) string {
			rotated := rename(t, dir, "data/r.ss", "data/r.ss.2")
			writeFile(t, filepath.Join(dir, "data/r.ss.1"), betweenHeader, between)
			return rotated
		}, true, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for _, d := range []string{"data", "old"} {
				if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			file := filepath.Join(dir, "data/r.ss")
			path := file
			if tc.symlink {
				path = filepath.Join(dir, "r.ss")
				if err := os.Symlink(file, path); err != nil {
					t.Fatal(err)
				}
			}
			old := frames("old", 1, 20, 1, 60)
			repl := frames("new", 1, 5, 1, 20)
			writeFile(t, file, oldHeader, old)
			fl, err := New(Options{Path: path, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			first := nextN(t, fl, 8, new(int))
			stored := fl.Position()
			var held *os.File
			if tc.held {
				held = fl.Hold()
			}
			fl.Close()

			// Rotated files written to last an hour before the grace: they
			// are left at once once read.
			if err := os.Chtimes(file, time.Time{}, time.Now().Add(-2*time.Hour)); err != nil {
				t.Fatal(err)
			}
			rotated := tc.rotate(t, dir)
			writeFile(t, file, lastHeader, repl)
			var log testutil.SyncBuffer
			obs := newObserver()
			if err := os.Chtimes(filepath.Join(dir, "data/r.ss.1"), time.Time{}, time.Now().Add(-2*time.Hour)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			fl, err = New(Options{Path: path, Resume: &stored, Held: held, PollInterval: 20 * time.Millisecond, RotationGrace: time.Hour,
				Observer: obs, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			want := old[:8:8]
			if tc.found {
				want = old
			}
			if tc.between {
				want = append(want[:len(want):len(want)], between...)
			}
			want = append(want[:len(want):len(want)], repl...)
			rest := collect(t, items, len(want)-8, 10*time.Second)
			if err := sameFrames(append(first, rest...), want); err != nil {
				t.Fatalf("%v\nlog:\n%s", err, log.String())
			}
			select {
			case it := <-items:
				t.Fatalf("after every record, another: %+v", it)
			case <-time.After(300 * time.Millisecond): // a few polls
			}
			if n, want := obs.count(EventReplaced), 1+btoi(tc.between); n != want {
				t.Errorf("%d replacements counted, want %d", n, want)
			}
			resumed := strings.Contains(log.String(), "rotated_path="+rotated)
			if tc.held {
				resumed = strings.Contains(log.String(), "held open since it was read")
			}
			lost := strings.Contains(log.String(), "level=ERROR msg=\"the file of the stored position is neither at the path nor in its directory")
			if resumed != tc.found || lost == tc.found {
				t.Errorf("resumed in the rotated file: %v, loss logged: %v; want %v, %v\nlog:\n%s", resumed, lost, tc.found, !tc.found, log.String())
			}
			if n, want := obs.count(EventLost), btoi(!tc.found); n != want {
				t.Errorf("%d losses told, want %d", n, want)
			}
			if n := obs.count(EventReplaced); tc.between && n != 2 {
				t.Errorf("%d replacements counted, want 2", n)
			}
		})
	}
}

// remove removes the file followed at data/r.ss (rotated away, then
// compressed or deleted), and returns "".
func remove(t *testing.T, dir string) string {
	if err := os.Remove(filepath.Join(dir, "data/r.ss")); err != nil {
		t.Fatal(err)
	}
	return ""
}

// The headers of the files rotated after the one of oldHeader: the next
// one, and the last, at the path; the frames of the next one.
var (
	between       = frames("between", 1, 3, 1, 20)
	betweenHeader = streamfile.Header{FileName: "r.ss", CreatedAtMs: 2, BeaconInterval: 1024}
	lastHeader    = streamfile.Header{FileName: "r.ss", CreatedAtMs: 3, BeaconInterval: 1024}
)

// TestRotatedTwiceWhileReading: two rotations while the follower is still
// reading the first file (closer together than its lag): after it, the
// file rotated in between is read, then the one at the path, each whole.
func TestRotatedTwiceWhileReading(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	old := frames("old", 1, 20, 1, 60)
	repl := frames("new", 1, 5, 1, 20)
	writeFile(t, path, oldHeader, old)
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: 100 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	first := nextN(t, fl, 5, new(int))
	rename(t, dir, "r.ss", "r.ss.2")
	writeFile(t, filepath.Join(dir, "r.ss.1"), betweenHeader, between)
	writeFile(t, path, lastHeader, repl)
	items, stop := follow(t, fl)
	defer stop()
	want := append(append(old[:len(old):len(old)], between...), repl...)
	rest := collect(t, items, len(want)-5, 10*time.Second)
	if err := sameFrames(append(first, rest...), want); err != nil {
		t.Fatal(err)
	}
	if n := obs.count(EventReplaced); n != 2 {
		t.Errorf("%d replacements counted, want 2", n)
	}
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rename renames from to to, both under dir, and returns to's path.
func rename(t *testing.T, dir, from, to string) string {
	t.Helper()
	to = filepath.Join(dir, to)
	if err := os.Rename(filepath.Join(dir, from), to); err != nil {
		t.Fatal(err)
	}
	return to
}

// TestReplacedTwiceWithinGrace: the path names a second file, then a third,
// while the follower still reads the first to its end (within the grace):
// a symlink retargeted twice, or files renamed over the path twice. The
// file in between, which neither the path nor the rotations of the
// directory lead to any more (its header names another file, or it was
// unlinked by the rename over it), is read after the first, before the one
// now at the path, even when it was removed meanwhile.
func TestReplacedTwiceWithinGrace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		symlink bool
		remove  bool // the second file is removed once the third is at the path
	}{
		{"symlink retargeted", true, false},
		{"symlink retargeted, the file in between removed", true, true},
		{"renamed over", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := filepath.Join(dir, "r.ss")
			// put writes the i-th file, then makes the path name it.
			put := func(i int, fs []streamfile.Frame) string {
				name := fmt.Sprintf("f%d.ss", i)
				h := streamfile.Header{FileName: name, CreatedAtMs: uint64(i), BeaconInterval: 1024}
				if !tc.symlink {
					h.FileName = "r.ss"
				}
				file := filepath.Join(dir, name)
				writeFile(t, file, h, fs)
				if tc.symlink {
					tmp := filepath.Join(dir, "tmp")
					if err := errors.Join(os.Symlink(name, tmp), os.Rename(tmp, path)); err != nil {
						t.Fatal(err)
					}
				} else if err := os.Rename(file, path); err != nil {
					t.Fatal(err)
				}
				return file
			}
			first, second, third := frames("first", 1, 5, 1, 40), frames("second", 1, 4, 1, 40), frames("third", 1, 3, 1, 40)
			put(1, first)
			var log testutil.SyncBuffer
			items, got := startFollowing(t, Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: 300 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))}, len(first))
			file := put(2, second)
			waitFor(t, 5*time.Second, "the second file seen at the path", func() bool {
				return strings.Contains(log.String(), "another file at the path")
			})
			put(3, third)
			if tc.remove {
				if err := os.Remove(file); err != nil {
					t.Fatal(err)
				}
			}
			got = append(got, collect(t, items, len(second)+len(third), 5*time.Second)...)
			if err := sameFrames(got, slices.Concat(first, second, third)); err != nil {
				t.Fatalf("%v\nlog:\n%s", err, log.String())
			}
		})
	}
}

// TestResumeHeldWithoutPath: a follower started again (a reload) while no
// file is at the path, its stored position in a file rotated away and
// removed, reads that file on through the descriptor handed over (Held),
// then the file a producer creates at the path.
func TestResumeHeldWithoutPath(t *testing.T) {
	t.Parallel()
	path, old, got, stored, held := readSome(t, 20, 8)
	if err := os.Remove(path); err != nil { // rotated away and removed; no file at the path yet
		t.Fatal(err)
	}
	items, rest := startFollowing(t, Options{Path: path, Resume: &stored, Held: held, PollInterval: 20 * time.Millisecond, Logger: testLogger(t)}, 12)
	repl := frames("new", 1, 2, 1, 20)
	writeFile(t, path, lastHeader, repl)
	got = append(append(got, rest...), collect(t, items, len(repl), 5*time.Second)...)
	if err := sameFrames(got, append(old, repl...)); err != nil {
		t.Fatal(err)
	}
}

// TestResumeHeldAfter: a follower started again (a reload) with its
// position in a file rotated away, whose follower had gone on to the next
// file, since rotated away and removed too (compressed), reads the file of
// the position on, then the next one through the descriptor handed over
// (HeldAfter), then the file at the path. Without it, the file in between
// would be skipped: it is in no directory.
func TestResumeHeldAfter(t *testing.T) {
	t.Parallel()
	for _, atPath := range []bool{false, true} {
		t.Run(fmt.Sprintf("the last held at the path: %v", atPath), func(t *testing.T) {
			t.Parallel()
			path, old, got, stored, held := readSome(t, 20, 8)
			dir := filepath.Dir(path)
			rename(t, dir, "r.ss", "r.ss.1")
			if err := os.Remove(filepath.Join(dir, "r.ss.1")); err != nil { // rotated, then compressed
				t.Fatal(err)
			}
			mid := frames("mid", 1, 6, 1, 30)
			writeFile(t, path, newHeader, mid)
			next, err := os.Open(path) // the follower before read on into it
			if err != nil {
				t.Fatal(err)
			}
			after := []*os.File{next}
			rename(t, dir, "r.ss", "r.ss.1")
			if err := os.Remove(filepath.Join(dir, "r.ss.1")); err != nil {
				t.Fatal(err)
			}
			last := frames("new", 1, 3, 1, 20)
			writeFile(t, path, lastHeader, last)
			if atPath {
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				after = append(after, f) // the follower before saw it at the path
			}
			items, rest := startFollowing(t, Options{Path: path, Resume: &stored, Held: held, HeldAfter: after,
				PollInterval: 20 * time.Millisecond, RotationGrace: 50 * time.Millisecond, Logger: testLogger(t)}, 12+len(mid)+len(last))
			if err := sameFrames(append(got, rest...), slices.Concat(old, mid, last)); err != nil {
				t.Fatal(err)
			}
			noMore(t, items)
		})
	}
}

// TestResumeHeldAtItsEnd: a follower started again (a reload) with its
// position at the end of the file it held, which a copy of it replaced at
// the path (cp -p, then mv), reads the copy on from the position: nothing
// again. The held file, with nothing after the position, gives way to the
// copy.
func TestResumeHeldAtItsEnd(t *testing.T) {
	t.Parallel()
	path, old, _, stored, held := readSome(t, 10, 10)
	tmp := filepath.Join(filepath.Dir(path), ".r.ss.tmp")
	writeFile(t, tmp, oldHeader, old)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	items, _ := startFollowing(t, Options{Path: path, Resume: &stored, Held: held, PollInterval: 20 * time.Millisecond, RotationGrace: 50 * time.Millisecond, Logger: testLogger(t)}, 0)
	more := frames("old", 11, 2, 11, 60)
	appendFrames(t, path, more)
	if err := sameFrames(collect(t, items, len(more), 5*time.Second), more); err != nil {
		t.Fatal(err)
	}
	noMore(t, items)
}

// TestResumeHeldReadToItsEnd: a follower started again (a reload) with its
// position at the end of the held file, rotated away and removed since,
// with no copy of it anywhere, reads it on (a writer that kept it open may
// still append to it), then the file at the path: nothing was lost, and no
// loss is told.
func TestResumeHeldReadToItsEnd(t *testing.T) {
	t.Parallel()
	path, _, _, stored, held := readSome(t, 10, 10)
	if err := os.Remove(path); err != nil { // rotated away, then compressed
		t.Fatal(err)
	}
	repl := frames("new", 1, 3, 1, 20)
	writeFile(t, path, lastHeader, repl)
	obs := newObserver()
	var log testutil.SyncBuffer
	items, _ := startFollowing(t, Options{Path: path, Resume: &stored, Held: held, PollInterval: 20 * time.Millisecond, RotationGrace: 50 * time.Millisecond,
		Observer: obs, Logger: slog.New(slog.NewTextHandler(&log, nil))}, 0)
	if err := sameFrames(collect(t, items, len(repl), 5*time.Second), repl); err != nil {
		t.Fatal(err)
	}
	if n := obs.count(EventLost); n != 0 || !strings.Contains(log.String(), "held open since it was read") {
		t.Errorf("%d losses told, want 0, the held file read on:\n%s", n, log.String())
	}
}

// TestRotatedLeftAtGraceEnd: a file rotated away and read to its end is
// left when its grace ends, and the record already in the file at the path
// read then, not at the next poll: nothing else wakes a quiet follower.
func TestRotatedLeftAtGraceEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	old := frames("old", 1, 5, 1, 40)
	writeFile(t, path, oldHeader, old)
	obs := newObserver()
	items, got := startFollowing(t, Options{Path: path, PollInterval: time.Hour, RotationGrace: 200 * time.Millisecond, Observer: obs, Logger: testLogger(t)}, len(old))
	if err := sameFrames(got, old); err != nil {
		t.Fatal(err)
	}
	rename(t, dir, "r.ss", "r.ss.1")
	repl := frames("new", 1, 1, 1, 20)
	writeFile(t, path, lastHeader, repl)
	if err := sameFrames(collect(t, items, len(repl), 10*time.Second), repl); err != nil {
		t.Fatal(err)
	}
	if n := obs.count(EventPollRead); n != 0 {
		t.Errorf("%d poll reads, want 0: the grace's end woke the follower", n)
	}
}

// TestSeenFullSaidOnce: more files at the path than a follower keeps while
// it drains the open one are said once, not at every look.
func TestSeenFullSaidOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	writeFile(t, filepath.Join(dir, "f0.ss"), oldHeader, frames("k", 1, 3, 1, 40))
	if err := os.Symlink("f0.ss", path); err != nil {
		t.Fatal(err)
	}
	var log testutil.SyncBuffer
	startFollowing(t, Options{Path: path, PollOnly: true, PollInterval: 20 * time.Millisecond, RotationGrace: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}, 3)
	const msg = "the path named more files than a follower keeps"
	for i := 1; i <= maxSeen+2; i++ {
		name := fmt.Sprintf("f%d.ss", i)
		writeFile(t, filepath.Join(dir, name), lastHeader, frames("k", 1, 1, 1, 10))
		tmp := path + ".tmp"
		if err := errors.Join(os.Symlink(name, tmp), os.Rename(tmp, path)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond) // a few looks at each
	}
	waitFor(t, 5*time.Second, "the full list said", func() bool { return strings.Contains(log.String(), msg) })
	time.Sleep(200 * time.Millisecond) // ten looks more
	if n := strings.Count(log.String(), msg); n != 1 {
		t.Errorf("said %d times, want once:\n%s", n, log.String())
	}
}

// TestResumeInCopyAtPath: a copy of the file of the stored position
// renamed over the path while nothing followed it (cp -p then mv, a
// restore) is read on from the position, and said to be such a copy, not
// a copytruncate's.
func TestResumeInCopyAtPath(t *testing.T) {
	t.Parallel()
	path, old, _, stored, held := readSome(t, 10, 4)
	held.Close() // as after a restart: nothing held
	tmp := filepath.Join(filepath.Dir(path), ".r.ss.tmp")
	writeFile(t, tmp, oldHeader, old)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	var log testutil.SyncBuffer
	items, rest := startFollowing(t, Options{Path: path, Resume: &stored, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}, 6)
	if err := sameFrames(rest, old[4:]); err != nil {
		t.Fatal(err)
	}
	noMore(t, items)
	if l := log.String(); !strings.Contains(l, "the file at the path is a copy of the file of the stored position") || strings.Contains(l, "copytruncate") {
		t.Errorf("the copy is not said as such:\n%s", l)
	}
}

// readSome writes n frames to r.ss in a new directory, reads k of them with
// a follower, and closes it; it returns the path, the frames, those read,
// and the follower's position and descriptor of the file (Hold).
func readSome(t *testing.T, n, k int) (string, []streamfile.Frame, []got, Position, *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r.ss")
	fs := frames("old", 1, n, 1, 60)
	writeFile(t, path, oldHeader, fs)
	fl, err := New(Options{Path: path, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	return path, fs, nextN(t, fl, k, new(int)), fl.Position(), fl.Hold()
}
