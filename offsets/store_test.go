package offsets

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/streamfile"
)

func testPosition(offset int64) Position {
	return Position{
		Stream:  "/s/orders.ss",
		File:    streamfile.Identity{Ino: 2, FileName: "orders", CreatedAtMs: 3},
		Offset:  offset,
		LastSeq: uint64(offset / 10),
	}
}

func openStore(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.lock != nil {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return s
}

func mustSet(t *testing.T, s *Store, name string, p Position) {
	t.Helper()
	if err := s.Set(name, p); err != nil {
		t.Fatal(err)
	}
}

func mustLoad(t *testing.T, dir string) map[string]Position {
	t.Helper()
	positions, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return positions
}

func TestOpenFresh(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	if _, ok := s.Get("billing"); ok {
		t.Fatal("a fresh store has a position")
	}
	if got := mustLoad(t, dir); len(got) != 0 {
		t.Fatalf("Load of a fresh directory: %v", got)
	}
	pid, err := os.ReadFile(filepath.Join(dir, LockName))
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(os.Getpid()) + "\n"; string(pid) != want {
		t.Fatalf("lock file holds %q, want %q", pid, want)
	}
}

// TestOpenMarker: with a marker, a first Open writes an empty sidecar; a
// directory whose marker exists and whose sidecar is gone is refused with
// a *MissingError that names both and the remedies, releases the lock and
// writes nothing; a sidecar with the marker loads as usual. Without a
// marker, a missing sidecar stays a fresh start that writes nothing.
// LoadMarked finds what Open with the marker would refuse.
func TestOpenMarker(t *testing.T) {
	const marker = "retry.spool"
	for _, tc := range []struct {
		name                 string
		marker, withMarker   bool // Options.Marker set; the marker file exists
		sidecar              bool // a sidecar with a position exists
		wantMissing, written bool // Open fails with a *MissingError; a sidecar exists after it
	}{
		{name: "first start", marker: true, written: true},
		{name: "sidecar gone", marker: true, withMarker: true, wantMissing: true},
		{name: "used", marker: true, withMarker: true, sidecar: true, written: true},
		{name: "no marker option", withMarker: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sidecar := filepath.Join(dir, SidecarName)
			if tc.withMarker {
				if err := os.WriteFile(filepath.Join(dir, marker), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.sidecar {
				s := openStore(t, dir, Options{})
				mustSet(t, s, "billing", testPosition(100))
				if err := errors.Join(s.Commit(), s.Close()); err != nil {
					t.Fatal(err)
				}
			}
			var lost *MissingError
			if _, err := LoadMarked(dir, marker); errors.As(err, &lost) != (tc.withMarker && !tc.sidecar) {
				t.Fatalf("LoadMarked: %v", err)
			}
			var opts Options
			if tc.marker {
				opts.Marker = marker
			}
			s, err := Open(dir, opts)
			var missing *MissingError
			if tc.wantMissing {
				if !errors.As(err, &missing) {
					t.Fatalf("Open: %v, want a *MissingError", err)
				}
				for _, want := range []string{sidecar, filepath.Join(dir, marker), "streamd offsets set --subscription=NAME --to=POSITION", "delete " + filepath.Join(dir, marker)} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q lacks %q", err, want)
					}
				}
				// The lock is released: another Open (offsets set) works.
				s = openStore(t, dir, Options{})
			} else if err != nil {
				t.Fatal(err)
			} else {
				t.Cleanup(func() { s.Close() })
			}
			if _, err := os.Stat(sidecar); (err == nil) != tc.written {
				t.Fatalf("sidecar after Open: %v, want it written: %v", err, tc.written)
			}
			if _, ok := s.Get("billing"); ok != tc.sidecar {
				t.Fatalf("position of billing found: %v, want %v", ok, tc.sidecar)
			}
			if got := mustLoad(t, dir); len(got) != len(s.entries) {
				t.Fatalf("Load after Open: %v", got)
			}
		})
	}
}

func TestOpenMissingDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := Open(dir, Options{})
	want := "offsets: lock: open " + filepath.Join(dir, LockName) + ": no such file or directory"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

func TestCommitReopen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	mustSet(t, s, "billing", testPosition(4096))
	mustSet(t, s, "audit", testPosition(128))
	before := time.Now()
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openStore(t, dir, Options{})
	for name, want := range map[string]Position{"billing": testPosition(4096), "audit": testPosition(128)} {
		got, ok := s.Get(name)
		if !ok || !got.samePlace(want) {
			t.Fatalf("%s: got %+v, %v, want %+v", name, got, ok, want)
		}
		if got.CommittedAt.Before(before.Add(-time.Second)) || got.CommittedAt.After(time.Now()) {
			t.Fatalf("%s: CommittedAt %v is not the time of the commit", name, got.CommittedAt)
		}
	}
}

// TestCommittedAt checks that a commit stamps the positions it changed and
// keeps the time of the others.
func TestCommittedAt(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	mustSet(t, s, "billing", testPosition(10))
	mustSet(t, s, "audit", testPosition(10))
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	audit, _ := s.Get("audit")
	first, _ := s.Get("billing")
	if first.CommittedAt.IsZero() {
		t.Fatal("CommittedAt not stamped")
	}
	time.Sleep(10 * time.Millisecond)
	mustSet(t, s, "billing", testPosition(20))
	if got, _ := s.Get("billing"); !got.CommittedAt.Equal(first.CommittedAt) {
		t.Fatalf("Set changed CommittedAt to %v", got.CommittedAt)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("billing"); !got.CommittedAt.After(first.CommittedAt) {
		t.Fatalf("billing: CommittedAt %v, want after %v", got.CommittedAt, first.CommittedAt)
	}
	if got, _ := s.Get("audit"); !got.CommittedAt.Equal(audit.CommittedAt) {
		t.Fatalf("audit: CommittedAt %v, want %v", got.CommittedAt, audit.CommittedAt)
	}
	if diff := diffPositions(mustLoad(t, dir), map[string]Position{"billing": must(s.Get("billing")), "audit": audit}); diff != "" {
		t.Fatal(diff)
	}
}

func must(p Position, ok bool) Position {
	if !ok {
		panic("no position")
	}
	return p
}

// TestCommitNothingNew checks that a commit with nothing new writes
// nothing: neither a first commit with no positions, nor one after Set of
// the positions already stored.
func TestCommitNothingNew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SidecarName)
	var observed int
	s := openStore(t, dir, Options{Observe: func(time.Duration, error) { observed++ }})
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a commit of no positions wrote the sidecar: %v", err)
	}

	mustSet(t, s, "billing", testPosition(4096))
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	before := statFile(t, path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // past the mtime granularity
	p := testPosition(4096)
	p.CommittedAt = time.Now() // ignored by Set
	mustSet(t, s, "billing", p)
	for range 3 {
		if err := s.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	after := statFile(t, path)
	if after.Ino != before.Ino || after.Mtim != before.Mtim || after.Ctim != before.Ctim {
		t.Fatalf("a commit with nothing new rewrote the sidecar: inode %d→%d, mtime %v→%v",
			before.Ino, after.Ino, before.Mtim, after.Mtim)
	}
	if again, err := os.ReadFile(path); err != nil || string(again) != string(data) {
		t.Fatalf("the sidecar changed: %v", err)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
	if observed != 1 {
		t.Fatalf("Observe called %d times, want 1", observed)
	}
}

func statFile(t *testing.T, path string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSetInvalid(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	mustSet(t, s, "billing", testPosition(10))
	for _, tc := range []struct {
		name string
		sub  string
		edit func(*Position)
		want string
	}{
		{"empty name", "", func(*Position) {}, "offsets: set: empty subscription name"},
		{"negative offset", "billing", func(p *Position) { p.Offset = -1 }, `offsets: set: subscription "billing": negative offset -1`},
		{"name not UTF-8", "bil\xffling", func(*Position) {}, `offsets: set: subscription name "bil\xffling" is not valid UTF-8`},
		{"stream not UTF-8", "billing", func(p *Position) { p.Stream = "/s/\xff.ss" }, `offsets: set: subscription "billing": stream path "/s/\xff.ss" is not valid UTF-8`},
		{"file name not UTF-8", "billing", func(p *Position) { p.File.FileName = "\xfe" }, `offsets: set: subscription "billing": file name "\xfe" is not valid UTF-8`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPosition(20)
			tc.edit(&p)
			if err := s.Set(tc.sub, p); err == nil || err.Error() != tc.want {
				t.Fatalf("got %v, want %s", err, tc.want)
			}
			if got, _ := s.Get("billing"); !got.samePlace(testPosition(10)) {
				t.Fatalf("a failed Set changed the position to %+v", got)
			}
		})
	}
}

// TestOpenLocked checks that a second Open of a directory fails at once,
// naming the lock file and the holder, that Load still works, and that
// Close hands the directory over.
func TestOpenLocked(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	mustSet(t, s, "billing", testPosition(10))
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir, Options{})
	want := fmt.Sprintf("offsets: another streamd (pid %d) holds %s; only one streamd may use a state directory at a time",
		os.Getpid(), filepath.Join(dir, LockName))
	var locked *LockedError
	if !errors.As(err, &locked) || err.Error() != want {
		t.Fatalf("second Open:\n got %v\nwant %s", err, want)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(10)) {
		t.Fatalf("Load while locked: %v", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	openStore(t, dir, Options{})
}

// TestOpenLockedByOtherProcess checks the lock against another process,
// and that the lock goes with it.
func TestOpenLockedByOtherProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := helperCommand("hold", dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("locked\n"))
	if _, err := stdout.Read(line); err != nil || string(line) != "locked\n" {
		t.Fatalf("helper: %q, %v, %v\n%s", line, err, cmd.Wait(), stderr.String())
	}

	start := time.Now()
	_, err = Open(dir, Options{})
	want := fmt.Sprintf("offsets: another streamd (pid %d) holds %s; only one streamd may use a state directory at a time",
		cmd.Process.Pid, filepath.Join(dir, LockName))
	if err == nil || err.Error() != want {
		t.Fatalf("Open:\n got %v\nwant %s", err, want)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Open took %v to fail", d)
	}

	if err := stdin.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\n%s", err, stderr.String())
	}
	openStore(t, dir, Options{})
}

func TestClose(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err == nil || err.Error() != "offsets: close: store is already closed" {
		t.Fatalf("second Close: %v", err)
	}
	mustSet(t, s, "billing", testPosition(10))
	if err := s.Commit(); err == nil || err.Error() != "offsets: commit: store is closed" {
		t.Fatalf("Commit after Close: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, LockName)); len(got) != 0 {
		t.Fatalf("Close left %q in the lock file", got)
	}
}

// TestCommitError checks that a failed commit leaves the sidecar and no
// temporary file, reports to Observe, and that its positions are written
// by the next commit.
func TestCommitError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SidecarName)
	var errs []error
	s := openStore(t, dir, Options{Observe: func(_ time.Duration, err error) { errs = append(errs, err) }})
	mustSet(t, s, "billing", testPosition(10))

	// rename(2) cannot replace a directory with a file.
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := s.Commit()
	want := "offsets: commit: rename " + path + ".tmp " + path + ": file exists"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
	if len(errs) != 1 || errs[0] == nil || errs[0].Error() != want {
		t.Fatalf("Observe saw %v", errs)
	}

	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(10)) {
		t.Fatalf("after the failed commit: %v", got)
	}
	if len(errs) != 2 || errs[1] != nil {
		t.Fatalf("Observe saw %v", errs)
	}
}

// TestCommitSync checks that Options.Sync runs after the positions are
// captured and before the sidecar is written, and that its error aborts
// the commit.
func TestCommitSync(t *testing.T) {
	dir := t.TempDir()
	var s *Store
	var syncErr error
	syncs := 0
	s = openStore(t, dir, Options{Sync: func() error {
		syncs++
		if syncs == 2 {
			// The sidecar still has the first commit.
			if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(10)) {
				t.Errorf("Sync called after the write: %v", got)
			}
			// A record settled now is not covered by this sync, so
			// this commit must not store its position.
			mustSet(t, s, "billing", testPosition(30))
		}
		return syncErr
	}})

	mustSet(t, s, "billing", testPosition(10))
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	mustSet(t, s, "billing", testPosition(20))
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(20)) {
		t.Fatalf("second commit stored %+v, want offset 20", got["billing"])
	}

	syncErr = errors.New("fsync /s/orders.ss: input/output error")
	err := s.Commit()
	if want := "offsets: commit: sync streams: fsync /s/orders.ss: input/output error"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(20)) {
		t.Fatalf("a failed sync let the commit write %+v", got["billing"])
	}
	syncErr = nil
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(30)) {
		t.Fatalf("third commit stored %+v, want offset 30", got["billing"])
	}
	if syncs != 4 {
		t.Fatalf("Sync called %d times, want 4", syncs)
	}
}

// TestRun checks the commit loop on a fake clock: a commit per tick when
// something changed, none otherwise, and a last one when ctx ends.
func TestRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var commits int
		s := openStore(t, dir, Options{Observe: func(_ time.Duration, err error) {
			if err != nil {
				t.Error(err)
			}
			commits++
		}})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.Run(ctx, 0) }()

		mustSet(t, s, "billing", testPosition(10))
		time.Sleep(time.Second)
		synctest.Wait()
		if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(10)) || commits != 1 {
			t.Fatalf("after one tick: %d commits, %v", commits, got)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if commits != 1 {
			t.Fatalf("%d commits without a change, want none", commits-1)
		}

		mustSet(t, s, "billing", testPosition(20))
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(20)) || commits != 2 {
			t.Fatalf("after the end: %d commits, %v", commits, got)
		}
	})
}

// BenchmarkCommit measures one commit of 16 subscriptions, fsyncs included.
func BenchmarkCommit(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for k := range 16 {
		if err := s.Set(fmt.Sprintf("subscription-%02d", k), testPosition(int64(k))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var offset int64
	for b.Loop() {
		offset++
		if err := s.Set("subscription-00", testPosition(offset)); err != nil {
			b.Fatal(err)
		}
		if err := s.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConcurrentSetCommit runs Set from several goroutines against
// commits, for the race detector, and checks that the last commit holds
// the last positions.
func TestConcurrentSetCommit(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	const writers, steps = 8, 200
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- s.Run(ctx, time.Millisecond) }()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range int64(steps) {
				if err := s.Set(fmt.Sprintf("sub-%d", w), testPosition(i*10)); err != nil {
					t.Error(err)
				}
				s.Get(fmt.Sprintf("sub-%d", (w+1)%writers))
			}
		})
	}
	wg.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := mustLoad(t, dir)
	for w := range writers {
		if p := got[fmt.Sprintf("sub-%d", w)]; !p.samePlace(testPosition((steps - 1) * 10)) {
			t.Errorf("sub-%d: %+v", w, p)
		}
	}
}

// TestOpenLockedByOrphan: the lock is held through a child of a streamd
// that has died (killed while the child was between fork and exec), and
// the lock file names the dead streamd: Open waits for the child to go
// instead of failing.
func TestOpenLockedByOrphan(t *testing.T) {
	dir := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, LockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := durable.TryLock(f.Fd(), durable.Exclusive); !ok || err != nil {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if _, err := f.WriteString(strconv.Itoa(dead.Process.Pid) + "\n"); err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "0.3")
	child.ExtraFiles = []*os.File{f} // shares the locked open file description
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	openStore(t, dir, Options{}) // fails at once without the wait
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
}

// samePlace reports whether p and q resume at the same place, ignoring
// CommittedAt.
func (p Position) samePlace(q Position) bool {
	return p.Stream == q.Stream && p.File == q.File && p.Offset == q.Offset && p.LastSeq == q.LastSeq
}

// TestCommitMendsStateFiles: a commit finds the lock file and the sidecar
// removed while the Store is open (a state directory cleaned by hand),
// makes them again and says so; a lock file that another streamd made
// meanwhile fails every commit, which takes nothing from it, even once
// that streamd stopped; a commit that passes after failing is observed,
// also with nothing to write.
func TestCommitMendsStateFiles(t *testing.T) {
	dir := t.TempDir()
	lock, sidecar := filepath.Join(dir, LockName), filepath.Join(dir, SidecarName)
	var logs strings.Builder
	var observed []error
	s := openStore(t, dir, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Observe: func(_ time.Duration, err error) { observed = append(observed, err) }})
	mustSet(t, s, "billing", testPosition(10))
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}

	// Both removed, nothing new to commit.
	for _, f := range []string{lock, sidecar} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(10)) {
		t.Errorf("sidecar after the commit: %v, want billing's position again", got)
	}
	if _, err := Open(dir, Options{}); !errors.As(err, new(*LockedError)) {
		t.Errorf("Open of the directory after the commit: %v, want a *LockedError (the lock file made again and held)", err)
	}
	for _, msg := range []string{msgLockRemade, msgSidecarRemade} {
		if strings.Count(logs.String(), msg) != 1 {
			t.Errorf("want one log line %q:\n%s", msg, logs.String())
		}
	}

	// Removed, and made by another streamd before the next commit.
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	other := openStore(t, dir, Options{})
	observed = nil
	if err := s.Commit(); !errors.As(err, new(*LockedError)) {
		t.Fatalf("commit after another streamd took the lock: %v, want a *LockedError", err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); !errors.As(err, new(*LockedError)) {
		t.Fatalf("commit after the other streamd stopped: %v, want a *LockedError still: its lock file is not this one's", err)
	}
	if got := mustLoad(t, dir); !got["billing"].samePlace(testPosition(10)) {
		t.Errorf("sidecar after the refused commits: %v, want billing's position as it was", got)
	}

	// The other's lock file removed in turn: this one's is made again,
	// and the commit, with nothing to write, is observed to pass.
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if len(observed) != 3 || observed[0] == nil || observed[1] == nil || observed[2] != nil {
		t.Errorf("observed %v, want two failures and the first commit that passed", observed)
	}
}
