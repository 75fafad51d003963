package tail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// replacement is a way the file at a path is replaced by new content.
type replacement struct {
	name string
	// inPlace: the old file's bytes are gone, so the records the follower
	// has not read yet are lost with them; the test waits until it has
	// read them.
	inPlace bool
	// longer: the new file is longer than the old one, so only its new
	// header tells it apart.
	longer bool
	do     func(t *testing.T, path string, h streamfile.Header, fs []streamfile.Frame)
}

var replacements = []replacement{
	{"truncate and rewrite", true, false, func(t *testing.T, path string, h streamfile.Header, fs []streamfile.Frame) {
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		writeFile(t, path, h, fs)
	}},
	{"truncate and rewrite, longer", true, true, func(t *testing.T, path string, h streamfile.Header, fs []streamfile.Frame) {
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		writeFile(t, path, h, fs)
	}},
	{"truncate and rewrite with the same header", true, false, func(t *testing.T, path string, h streamfile.Header, fs []streamfile.Frame) {
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		h.CreatedAtMs = 1 // as the old file's
		writeFile(t, path, h, fs)
	}},
	{"rename over", false, false, func(t *testing.T, path string, h streamfile.Header, fs []streamfile.Frame) {
		tmp := path + ".tmp"
		writeFile(t, tmp, h, fs)
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}},
	{"delete and recreate", false, false, func(t *testing.T, path string, h streamfile.Header, fs []streamfile.Frame) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		writeFile(t, path, h, fs)
	}},
}

// oldHeader and newHeader are the headers of the file before and after the
// replacement; the new file is much shorter than the position the follower
// has reached in the old one.
var (
	oldHeader = streamfile.Header{FileName: "r.ss", CreatedAtMs: 1, BeaconInterval: 1024}
	newHeader = streamfile.Header{FileName: "r.ss", CreatedAtMs: 2, BeaconInterval: 1024}
)

// checkDelivery checks that each file is read in order without a record
// twice, and that a file read after another one (or after the same file was
// truncated: it can keep its identity) is read from its beginning.
func checkDelivery(t *testing.T, gotten []got) {
	t.Helper()
	for i := 1; i < len(gotten); i++ {
		g, last := gotten[i], gotten[i-1]
		switch {
		case g.File == last.File && g.Offset >= last.End:
		case g.Offset == streamfile.HeaderSize:
		default:
			t.Fatalf("record %d: %s after %s", i, g, last)
		}
	}
}

// TestReplaceLive replaces the file while the follower reads it. The
// replacement happens when the follower has read everything and is about to
// wait; just before it, frames are appended to the old file (unless the
// replacement destroys them): those are delivered, then the new file from
// its beginning, which is then followed.
func TestReplaceLive(t *testing.T) {
	for _, rp := range replacements {
		t.Run(rp.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.ss")
			old := frames("old", 1, 80, 1, 60)
			repl := frames("new", 1, 40, 1, 20)
			if rp.longer {
				repl = frames("new", 1, 40, 1, 400)
			}
			writeFile(t, path, oldHeader, old[:50])
			if rp.inPlace {
				appendFrames(t, path, old[50:])
			}
			var armed bool
			onWait := func() {
				if !armed {
					return
				}
				armed = false
				if !rp.inPlace {
					appendFrames(t, path, old[50:])
				}
				rp.do(t, path, newHeader, repl[:35])
			}
			obs := newObserver()
			fl, err := New(Options{Path: path, PollInterval: time.Hour, Observer: obs, Logger: testLogger(t), OnWait: onWait})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			read := 0
			next := func(n int) []got { return nextN(t, fl, n, &read) }
			gotten := next(50)
			if rp.inPlace {
				gotten = append(gotten, next(30)...)
			}
			armed = true
			gotten = append(gotten, next(80+35-len(gotten))...)
			if armed {
				t.Fatal("the follower never waited")
			}
			appendFrames(t, path, repl[35:])
			gotten = append(gotten, next(5)...)
			if err := sameFrames(gotten, append(old[:80:80], repl...)); err != nil {
				t.Fatal(err)
			}
			checkDelivery(t, gotten)
			e := EventReplaced
			if rp.inPlace {
				e = EventTruncated
			}
			if obs.count(e) != 1 {
				t.Fatalf("observer: %v, want one %s", obs, e)
			}
		})
	}
}

// TestReplaceWhileStopped replaces the file while no follower runs, after
// one stored a position past the end of the new file: a follower resuming
// from it reads the new file from its beginning.
func TestReplaceWhileStopped(t *testing.T) {
	for _, rp := range replacements {
		t.Run(rp.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.ss")
			old := frames("old", 1, 80, 1, 60)
			repl := frames("new", 1, 10, 1, 20)
			if rp.longer {
				repl = frames("new", 1, 40, 1, 400)
			}
			writeFile(t, path, oldHeader, old)
			fl, err := New(Options{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			for range 60 {
				if _, err := fl.Next(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			stored := fl.Position()
			if err := fl.Close(); err != nil {
				t.Fatal(err)
			}
			rp.do(t, path, newHeader, repl)
			if fi, _ := os.Stat(path); !rp.longer && fi.Size() >= stored.Offset {
				t.Fatalf("new file of %d bytes is not shorter than the stored offset %d", fi.Size(), stored.Offset)
			}
			obs := newObserver()
			fl, err = New(Options{Path: path, Resume: &stored, Start: Start{kind: startEnd}, Replay: true, Observer: obs, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			var gotten []got
			for {
				r, err := fl.Next(context.Background())
				if err != nil {
					break
				}
				gotten = append(gotten, copyRecord(r))
			}
			if err := sameFrames(gotten, repl); err != nil {
				t.Fatal(err)
			}
			if obs.count(EventReplaced)+obs.count(EventTruncated) != 1 {
				t.Fatalf("observer: %v", obs)
			}
		})
	}
}

// TestResume continues from a stored position of the same file.
func TestResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.ss")
	fs := frames("r", 1, 100, 1, 300)
	writeFile(t, path, oldHeader, fs)
	fl, err := New(Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	for range 37 {
		if _, err := fl.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	stored := fl.Position()
	fl.Close()
	for _, tc := range []struct {
		name   string
		resume Position
		first  uint64 // seq of the first record
		event  Event
	}{
		{"same file", stored, 38, 0},
		{"another file", Position{File: streamfile.Identity{Ino: stored.File.Ino + 1, FileName: "r.ss", CreatedAtMs: 1}, Offset: stored.Offset}, 1, EventReplaced},
		{"reused inode", Position{File: streamfile.Identity{Ino: stored.File.Ino, FileName: "r.ss", CreatedAtMs: 2}, Offset: stored.Offset}, 1, EventReplaced},
		{"not a frame boundary", Position{File: stored.File, Offset: stored.Offset + 1}, 1, EventTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := newObserver()
			fl, err := New(Options{Path: path, Resume: &tc.resume, Replay: true, Observer: obs, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			r, err := fl.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if r.Seq != tc.first {
				t.Fatalf("first record seq %d, want %d", r.Seq, tc.first)
			}
			if tc.event != 0 && obs.count(tc.event) != 1 {
				t.Fatalf("observer: %v, want one %s", obs, tc.event)
			}
		})
	}
}

// TestRemoveAndReturn removes the path, keeps writing to the removed file,
// and then creates a new file at the path.
func TestRemoveAndReturn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gone.ss")
	old := frames("old", 1, 30, 1, 40)
	repl := frames("new", 1, 10, 1, 40)
	writeFile(t, path, oldHeader, old[:10])
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	gotten := collect(t, items, 10, 10*time.Second)
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for obs.count(EventRemoved) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("removal not reported: %v", obs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A writer that still has the removed file open appends to it: the
	// poll finds those frames.
	if err := w.Append(old[10:]...); err != nil {
		t.Fatal(err)
	}
	gotten = append(gotten, collect(t, items, 20, 10*time.Second)...)
	writeFile(t, path, newHeader, repl)
	gotten = append(gotten, collect(t, items, 10, 10*time.Second)...)
	if err := sameFrames(gotten, append(old, repl...)); err != nil {
		t.Fatal(err)
	}
	checkDelivery(t, gotten)
	stop()
	if obs.count(EventRemoved) != 1 || obs.count(EventReplaced) != 1 {
		t.Fatalf("observer: %v", obs)
	}
}

// TestReplaceWaitsForLockedWriter: a writer that holds the old file's lock
// when the path is replaced (it found the path unchanged under the lock, as
// streamfile's RefuseReplaced does, and is still writing) finishes its
// batch before the follower leaves the file: the follower looks at the old
// file's size under a shared lock and reads up to it, so the batch's frames
// come before the new file's, and none is lost.
func TestReplaceWaitsForLockedWriter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	old := frames("old", 1, 30, 1, 60)
	repl := frames("new", 1, 5, 1, 20)
	writeFile(t, path, oldHeader, old[:20])
	// The bytes the writer's batch adds: the file with the last 10 frames
	// appended, from the old end on.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch.ss")
	if err := os.WriteFile(scratch, data, 0o644); err != nil {
		t.Fatal(err)
	}
	appendFrames(t, scratch, old[20:])
	grown, err := os.ReadFile(scratch)
	if err != nil {
		t.Fatal(err)
	}
	batch := grown[len(data):]

	fl, err := New(Options{Path: path, PollInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	first := collect(t, items, 20, 5*time.Second)

	w, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := unix.Flock(int(w.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path+".new", newHeader, repl)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the follower notices and waits for the lock
	if _, err := w.WriteAt(batch, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(w.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	oldThenNew(t, items, first, old, repl)
}

// oldThenNew collects the frames that follow first, those of the old file
// and then those of the new one, repl, and checks that every frame of
// both came, the old file's first.
func oldThenNew(t *testing.T, items <-chan item, first []got, old, repl []streamfile.Frame) {
	t.Helper()
	n := len(old) - len(first)
	rest := collect(t, items, n+len(repl), 10*time.Second)
	if err := sameFrames(append(first, rest[:n]...), old); err != nil {
		t.Errorf("the old file: %v", err)
	}
	if err := sameFrames(rest[n:], repl); err != nil {
		t.Errorf("the new file: %v", err)
	}
}

// TestReplaceGrace: with Options.RotationGrace, a file renamed away from
// the path is followed while a producer still writes to it, until it has
// not grown for the grace period; then the new file is read. Every frame
// of both files comes, the old file's first.
func TestReplaceGrace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, moved := filepath.Join(dir, "r.ss"), filepath.Join(dir, "r.ss.1")
	old := frames("old", 1, 30, 1, 60)
	repl := frames("new", 1, 5, 1, 20)
	writeFile(t, path, oldHeader, old[:10])
	fl, err := New(Options{Path: path, PollInterval: 50 * time.Millisecond, RotationGrace: 500 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	first := collect(t, items, 10, 5*time.Second)
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, newHeader, repl)
	for i := 10; i < 30; i += 5 {
		time.Sleep(150 * time.Millisecond) // a producer's pace, within the grace period
		appendFrames(t, moved, old[i:i+5])
	}
	oldThenNew(t, items, first, old, repl)
}

// TestReplaceQuietProducerWritesAfterRotation: a producer that keeps its
// descriptor, quiet for longer than the grace before a rotation (renamed
// over, or renamed and then created: the follower sees no file at the
// path between), writes to the old file shortly after it: the follower
// reads it, as the grace counts from the rotation, not the last write.
func TestReplaceQuietProducerWritesAfterRotation(t *testing.T) {
	t.Parallel()
	for _, gap := range []bool{false, true} {
		t.Run(fmt.Sprintf("no file at the path between=%v", gap), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path, moved := filepath.Join(dir, "r.ss"), filepath.Join(dir, "r.ss.1")
			old := frames("old", 1, 12, 1, 60)
			repl := frames("new", 1, 5, 1, 20)
			writeFile(t, path, oldHeader, old[:10])
			w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{}) // the producer's descriptor
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			quiet := time.Now().Add(-10 * time.Second)
			if err := os.Chtimes(path, quiet, quiet); err != nil {
				t.Fatal(err)
			}
			obs := newObserver()
			fl, err := New(Options{Path: path, PollInterval: 50 * time.Millisecond, RotationGrace: 2 * time.Second, Observer: obs, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			first := collect(t, items, 10, 5*time.Second)
			if gap {
				if err := os.Rename(path, moved); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 5*time.Second, "the path seen without a file", func() bool { return obs.count(EventRemoved) == 1 })
				writeFile(t, path, newHeader, repl)
			} else {
				writeFile(t, path+".tmp", newHeader, repl)
				if err := os.Rename(path, moved); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(path+".tmp", path); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(300 * time.Millisecond) // the producer writes once more before it reopens
			if err := w.Append(old[10:]...); err != nil {
				t.Fatal(err)
			}
			oldThenNew(t, items, first, old, repl)
		})
	}
}

// TestReplaceFrequentRotations: rotations (a rename, then a create) every
// 300 ms, closer together than the grace (1 s): the follower leaves the
// first file once quiet for the grace after the first rotation, and reads
// the files rotated after it while the rotations go on, instead of
// starting the grace again at each of them.
func TestReplaceFrequentRotations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	writeFile(t, path, streamfile.Header{FileName: "r.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("f0", 1, 3, 1, 20))
	fl, err := New(Options{Path: path, PollInterval: 50 * time.Millisecond, RotationGrace: time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	collect(t, items, 3, 5*time.Second)
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		for i := 1; i <= 20; i++ {
			time.Sleep(300 * time.Millisecond)
			if err := os.Rename(path, fmt.Sprintf("%s.%d", path, i)); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(60 * time.Millisecond)
			writeFile(t, path, streamfile.Header{FileName: "r.ss", CreatedAtMs: uint64(1 + i), BeaconInterval: 1024}, frames(fmt.Sprintf("f%d", i), 1, 3, 1, 20))
		}
	}()
	// The rotations last 7 s; the first file is left about 1 s after
	// the first of them.
	if got := collect(t, items, 3, 4*time.Second); got[0].Key != "f1" {
		t.Errorf("read %s after the first file, want f1, the file rotated next", got[0].Key)
	}
}

// TestReplaceByNonStreamFile: a file that is not a stream file takes the
// path (a wrong file copied over it): the follower counts it, tells it as
// a trouble, waits without failing, and reads the stream file that
// replaces it in turn from its beginning, telling the trouble's end.
func TestReplaceByNonStreamFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	old := frames("old", 1, 10, 1, 60)
	repl := frames("new", 1, 5, 1, 20)
	writeFile(t, path, oldHeader, old)
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 50 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	first := collect(t, items, len(old), 5*time.Second)
	wrong := filepath.Join(dir, "wrong")
	if err := errors.Join(os.WriteFile(wrong, bytes.Repeat([]byte("not a stream file\n"), 20), 0o644), os.Rename(wrong, path)); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, obs, items, EventFormat, 1, "while the path names a file that is not a stream file")
	if told := obs.told(); len(told) != 1 || !strings.Contains(told[0], path) || !strings.Contains(told[0], "not a stream file") {
		t.Errorf("troubles told %q, want one naming the path and saying it is not a stream file", told)
	}
	next := filepath.Join(dir, "next")
	writeFile(t, next, newHeader, repl)
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
	rest := collect(t, items, len(repl), 10*time.Second)
	if err := sameFrames(append(first, rest...), append(old[:len(old):len(old)], repl...)); err != nil {
		t.Fatal(err)
	}
	if n := obs.count(EventFormat); n != 1 {
		t.Errorf("%d format events, want 1", n)
	}
	if told := obs.told(); len(told) != 2 || told[1] != "" {
		t.Errorf("troubles told %q, want the one, then its end", told)
	}
}

// TestTruncatedUnread: a file truncated under the follower (logrotate's
// copytruncate) and written again is read from its beginning; when the
// follower had not read all it saw of the old file, that rest is lost to
// it, and it says so at ERROR with how much at least; when it had read
// everything, the truncation is only a warning.
func TestTruncatedUnread(t *testing.T) {
	for _, tc := range []struct {
		name    string
		read    int // of the 3000 old records, before the truncation
		written int // new records, before the follower looks
		payload int // bytes of each new record
		lostLog bool
	}{
		{"behind", 10, 5, 100, true},
		{"behind, written past the read position again", 10, 50, 37, true},
		{"behind, written alike past the read position again", 10, 50, 100, true}, // new frames where the old ones were
		{"caught up", 3000, 5, 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.ss")
			old := frames("old", 1, 3000, 1, 100) // far more than one read
			writeFile(t, path, oldHeader, old)
			var log testutil.SyncBuffer
			obs := newObserver()
			fl, err := New(Options{Path: path, PollInterval: time.Hour, Observer: obs, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			read := 0
			gotten := nextN(t, fl, tc.read, &read)
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
			writeFile(t, path, newHeader, frames("new", 1, tc.written, 1, tc.payload))
			for gotten[len(gotten)-1].Key != "new" {
				gotten = append(gotten, nextN(t, fl, 1, &read)...)
			}
			if first := gotten[len(gotten)-1]; first.Seq != 1 || first.Offset != streamfile.HeaderSize {
				t.Errorf("the new file's first record read is %s, want seq 1 at its beginning", first)
			}
			checkDelivery(t, gotten)
			oldRead := len(gotten) - 1
			lost := strings.Contains(log.String(), "level=ERROR") && strings.Contains(log.String(), "unread_bytes_at_least=")
			switch {
			case tc.lostLog && (oldRead == len(old) || !lost):
				t.Errorf("%d of %d old records read, and the log does not say the rest is lost:\n%s", oldRead, len(old), log.String())
			case !tc.lostLog && (oldRead != len(old) || lost || !strings.Contains(log.String(), "level=WARN")):
				t.Errorf("%d of %d old records read; want all, and the truncation only warned of:\n%s", oldRead, len(old), log.String())
			}
			if n, want := obs.count(EventLost), btoi(tc.lostLog); n != want {
				t.Errorf("%d losses told, want %d", n, want)
			}
		})
	}
}

// truncatingFile truncates its file and writes it again, as copytruncate
// and the producer's writer do, right after the first read at or past
// offset from once armed: the bytes that read returned are the old file's.
type truncatingFile struct {
	*os.File
	arm     *atomic.Bool
	rewrite func()
	at      *atomic.Int64 // the offset of that read
}

func (f truncatingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	if n > 0 && off > streamfile.HeaderSize && f.arm.CompareAndSwap(true, false) {
		f.at.Store(off)
		f.rewrite()
	}
	return n, err
}

// TestTruncatedAfterRead: the records of a read made just before the file
// was truncated and written again are the old file's, and are handed out;
// then the new file is read from its beginning.
func TestTruncatedAfterRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.ss")
	writeFile(t, path, oldHeader, frames("old", 1, 3000, 1, 100)) // far more than one read
	var arm atomic.Bool
	var at atomic.Int64
	rewrite := func() {
		if err := os.Truncate(path, 0); err != nil {
			t.Error(err)
		}
		writeFile(t, path, newHeader, frames("new", 1, 1, 1, 10))
	}
	fl, err := newFollower(Options{Path: path, PollInterval: 20 * time.Millisecond, Logger: testLogger(t)},
		testHooks{open: func(name string) (file, error) {
			f, err := os.Open(name)
			if err != nil {
				return nil, err
			}
			return truncatingFile{f, &arm, rewrite, &at}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	read := 0
	gotten := nextN(t, fl, 10, &read)
	arm.Store(true) // the next read of records truncates the file after it
	for gotten[len(gotten)-1].Key != "new" {
		gotten = append(gotten, nextN(t, fl, 1, &read)...)
	}
	last := gotten[len(gotten)-2]
	if last.Key != "old" || last.End <= at.Load() {
		t.Errorf("the last old record handed out is %s, ending before the read at %d that the truncation followed: its records were dropped", last, at.Load())
	}
	checkDelivery(t, gotten)
}

// TestPathGoneLogged: a file renamed away from the path (as a rotation
// does before it creates the next one) is logged at INFO, a file removed
// at WARN; both are counted as EventRemoved.
func TestPathGoneLogged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		gone       func(path string) error
	}{
		{"renamed", "level=INFO msg=\"stream file renamed away from the path", func(path string) error { return os.Rename(path, path+".1") }},
		{"removed", "level=WARN msg=\"stream file removed", os.Remove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "r.ss")
			writeFile(t, path, oldHeader, frames("old", 1, 3, 1, 40))
			var log testutil.SyncBuffer
			obs := newObserver()
			fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, Observer: obs, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			collect(t, items, 3, 10*time.Second)
			if err := tc.gone(path); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "the path gone counted", func() bool { return obs.count(EventRemoved) == 1 })
			if !strings.Contains(log.String(), tc.want) {
				t.Errorf("log:\n%s\nwant a line %s", log.String(), tc.want)
			}
		})
	}
}

// TestLeftFileBack: a stream file renamed away from the path, with another
// file at the path for a while (a file that is not a stream file, or
// another stream file, which is read), then renamed back, is read on from
// where the follower left it: the records it read are not read again, and
// those written to it since are read. A file back at the path that was
// truncated meanwhile is read from its beginning, also when it was written
// again with records of the same sizes where those read were (cut, as
// streamd repair cuts, and appended to): its position fits it, but its
// last record read is not there any more, and read on from the position,
// the records written there would be lost.
func TestLeftFileBack(t *testing.T) {
	for _, tc := range []struct {
		name     string
		between  []streamfile.Frame // nil: a file that is not a stream file
		truncate bool               // the file is truncated before it is back
		rewrite  bool               // and written again as it was, with other records
	}{
		{name: "not a stream file between"},
		{name: "stream file between", between: frames("b", 1, 3, 1, 20)},
		{name: "truncated meanwhile", between: frames("b", 1, 3, 1, 20), truncate: true},
		{name: "rewritten meanwhile", between: frames("b", 1, 3, 1, 20), truncate: true, rewrite: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path, away := filepath.Join(dir, "r.ss"), filepath.Join(dir, "r.ss.away")
			fa := frames("a", 1, 8, 1, 40)
			writeFile(t, path, oldHeader, fa[:5])
			obs := newObserver()
			fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: 50 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			got := collect(t, items, 5, 5*time.Second)

			if err := os.Rename(path, away); err != nil {
				t.Fatal(err)
			}
			other := filepath.Join(dir, "other")
			if tc.between == nil {
				if err := os.WriteFile(other, bytes.Repeat([]byte("not a stream file\n"), 20), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				writeFile(t, other, newHeader, tc.between)
			}
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
			if tc.between == nil {
				awaitEvent(t, obs, items, EventFormat, 1, "while the path names a file that is not a stream file")
			} else {
				got = append(got, collect(t, items, len(tc.between), 5*time.Second)...)
			}

			want := append(fa[:5:5], tc.between...)
			if tc.truncate { // after its second record: the same header, the same inode
				if err := os.Truncate(away, got[2].Offset); err != nil {
					t.Fatal(err)
				}
				want = append(want, fa[:2]...)
			}
			if tc.rewrite { // records of the sizes of those read there
				rewritten := make([]streamfile.Frame, 3)
				for i := range rewritten {
					rewritten[i] = fa[2+i]
					rewritten[i].Seq, rewritten[i].TimestampMs = 100+uint64(i), 100+uint64(i)
					rewritten[i].Payload = bytes.Repeat([]byte{'x'}, len(fa[2+i].Payload))
				}
				appendFrames(t, away, rewritten)
				want = append(want, rewritten...)
			}
			appendFrames(t, away, fa[5:])
			want = append(want, fa[5:]...)
			if err := os.Rename(away, path); err != nil {
				t.Fatal(err)
			}
			got = append(got, collect(t, items, len(want)-len(got), 5*time.Second)...)
			if err := sameFrames(got, want); err != nil {
				t.Fatal(err)
			}
			noMore(t, items)
		})
	}
}

// TestLeftFileBackDamaged: a stream file the follower left while it passed
// over damaged bytes at its end comes back to the path: what it read of it
// is not read again, and the damage is met (and told) again.
func TestLeftFileBackDamaged(t *testing.T) {
	path, fs, _ := damagedFile(t, 11, damageKey)
	dir := filepath.Dir(path)
	away := path + ".away"
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, RotationGrace: 50 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	got := collect(t, items, 11, 5*time.Second)
	awaitEvent(t, obs, items, EventFormat, 1, "past the damage")
	if err := os.Rename(path, away); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	between := frames("b", 1, 3, 1, 20)
	writeFile(t, other, streamfile.Header{FileName: "d.ss", CreatedAtMs: 2, BeaconInterval: 64 << 10}, between)
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	got = append(got, collect(t, items, len(between), 5*time.Second)...)
	if err := os.Rename(away, path); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, obs, items, EventFormat, 2, "read again")
	if err := sameFrames(got, slices.Concat(fs[:11], between)); err != nil {
		t.Fatal(err)
	}
}

// awaitEvent waits until obs was told of event e n times, failing the test
// if a record comes meanwhile (while: what should hold no record back).
func awaitEvent(t *testing.T, obs *observer, items <-chan item, e Event, n int, while string) {
	t.Helper()
	for obs.count(e) < n {
		select {
		case it := <-items:
			t.Fatalf("%s: %+v", while, it)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestCopyAtPath: a copy of the stream file being read renamed over the
// path (cp -p, then mv; a restore) has the same header under another
// inode: it is read on from where the follower left the file, when the
// last record read of it is there too; a file with the same header but
// other records there, or a shorter copy, is read from its beginning.
func TestCopyAtPath(t *testing.T) {
	t.Parallel()
	fa := frames("a", 1, 8, 1, 40)
	other := make([]streamfile.Frame, 5) // the sizes of fa's, other payloads
	for i := range other {
		other[i] = fa[i]
		other[i].Payload = bytes.Repeat([]byte{'x'}, len(fa[i].Payload))
	}
	for _, tc := range []struct {
		name   string
		frames []streamfile.Frame // of the file renamed over the path
		readOn bool
	}{
		{"a copy", fa[:5], true},
		{"other records", other, false},
		{"a shorter copy", fa[:3], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path, tmp := filepath.Join(dir, "r.ss"), filepath.Join(dir, ".r.ss.tmp")
			writeFile(t, path, oldHeader, fa[:5])
			items, got := startFollowing(t, Options{Path: path, PollInterval: 20 * time.Millisecond, Logger: testLogger(t)}, 5)
			writeFile(t, tmp, oldHeader, tc.frames)
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
			appendFrames(t, path, fa[5:])
			want := fa[:5:5]
			if !tc.readOn {
				want = append(want, tc.frames...)
			}
			want = append(want, fa[5:]...)
			got = append(got, collect(t, items, len(want)-len(got), 5*time.Second)...)
			if err := sameFrames(got, want); err != nil {
				t.Fatal(err)
			}
			noMore(t, items)
		})
	}
}
