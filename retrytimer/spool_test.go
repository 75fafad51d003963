package retrytimer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/internal/testutil"
)

// fireDue fires every copy of q that is due, on the calling goroutine.
func fireDue(t *testing.T, q *Queue) {
	t.Helper()
	for {
		wait, err := q.fireOne(context.Background())
		if err != nil {
			t.Fatalf("fire: %v", err)
		}
		if wait != 0 {
			q.recordDone()
			return
		}
	}
}

// pendingKeys returns the keys of q's pending copies in due order, reading
// each from the spool.
func pendingKeys(t *testing.T, q *Queue) []string {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	es := slices.Clone(q.h)
	slices.SortFunc(es, func(a, b entry) int { return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.id, b.id)) })
	var keys []string
	for i := range es {
		c, err := q.copyOf(&es[i])
		if err != nil {
			t.Fatalf("read pending copy: %v", err)
		}
		want := testCopy(c.Key, dueOf(t, c), len(c.Record))
		if !bytes.Equal(c.Record, want.Record) || c.Stream != want.Stream || !dueOf(t, c).Equal(time.Unix(0, es[i].due)) {
			t.Errorf("pending copy %q reads back as %+v", c.Key, c)
		}
		keys = append(keys, c.Key)
	}
	return keys
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// writeSpool writes data as the spool of a new directory.
func writeSpool(t *testing.T, data []byte) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, SpoolName)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

func TestSpoolTornTail(t *testing.T) {
	now := time.Now()
	past, future := now.Add(-time.Hour), now.Add(time.Hour)
	tests := []struct {
		name   string
		before func(q *Queue)
		last   func(q *Queue) // writes the record that is cut
		intact []string       // pending with the last record intact
		torn   []string       // pending with the last record torn
	}{
		{
			name: "schedule record",
			before: func(q *Queue) {
				mustSchedule(t, q, "a", past)
				mustSchedule(t, q, "b", future)
				fireDue(t, q)
			},
			last:   func(q *Queue) { mustSchedule(t, q, "c", future.Add(time.Second)) },
			intact: []string{"b", "c"},
			torn:   []string{"b"},
		},
		{
			name: "done record",
			before: func(q *Queue) {
				mustSchedule(t, q, "b", future)
				mustSchedule(t, q, "a", past)
			},
			last:   func(q *Queue) { fireDue(t, q) },
			intact: []string{"b"},
			torn:   []string{"a", "b"}, // fired, but not known to be: fires again
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			q, err := Open(Options{Dir: dir, Fire: (&recorder{t: t}).fire})
			if err != nil {
				t.Fatal(err)
			}
			tt.before(q)
			lastStart := q.sp.size
			tt.last(q)
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(dir, SpoolName))
			if err != nil {
				t.Fatal(err)
			}

			type variant struct {
				name string
				data []byte
			}
			var variants []variant
			for cut := lastStart + 1; cut < int64(len(data)); cut++ {
				variants = append(variants, variant{fmt.Sprintf("cut at %d", cut), data[:cut]})
			}
			zeroed := bytes.Clone(data)
			clear(zeroed[lastStart+hdrSize+1:])
			flipped := bytes.Clone(data)
			flipped[len(flipped)-1] ^= 1
			variants = append(variants,
				variant{"body partly zero", zeroed},
				variant{"last byte flipped", flipped},
				variant{"zeros instead", append(bytes.Clone(data[:lastStart]), make([]byte, 100<<10)...)},
				variant{"zeros after", append(bytes.Clone(data), make([]byte, 5)...)},
			)
			for _, v := range variants {
				dir, path := writeSpool(t, v.data)
				q := mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire})
				want, wantSize := tt.torn, lastStart
				if v.name == "zeros after" {
					want, wantSize = tt.intact, int64(len(data))
				}
				if got := pendingKeys(t, q); !slices.Equal(got, want) {
					t.Errorf("%s: pending %v, want %v", v.name, got, want)
				}
				if got := fileSize(t, path); got != wantSize {
					t.Errorf("%s: size after Open = %d, want %d", v.name, got, wantSize)
				}
				// Appends go where the torn record was.
				mustSchedule(t, q, "d", future.Add(time.Minute))
				if err := q.Close(); err != nil {
					t.Fatal(err)
				}
				q = mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire})
				if got, want := pendingKeys(t, q), append(slices.Clone(want), "d"); !slices.Equal(got, want) {
					t.Errorf("%s: pending after an append %v, want %v", v.name, got, want)
				}
			}

			dir, path := writeSpool(t, data)
			q = mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire})
			if got := pendingKeys(t, q); !slices.Equal(got, tt.intact) {
				t.Errorf("intact: pending %v, want %v", got, tt.intact)
			}
			if got := fileSize(t, path); got != int64(len(data)) {
				t.Errorf("intact: size after Open = %d, want %d", got, len(data))
			}
		})
	}
}

// raw returns a record with a valid header around body.
func raw(body ...byte) []byte {
	rec := append(make([]byte, hdrSize), body...)
	seal(rec)
	return rec
}

func TestSpoolCorruption(t *testing.T) {
	due := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	sched := func(id uint64) []byte {
		rec, err := encodeSchedule(id, due.UnixNano(), int64(time.Minute), &Copy{Stream: "s", Key: "k", Record: []byte("p")})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	recA, recB := sched(1), sched(2)
	afterA := int64(len(fileMagic) + len(recA))
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	flip := func(b []byte, i int) []byte {
		b = bytes.Clone(b)
		b[i] ^= 0x10
		return b
	}
	magic := []byte(fileMagic)
	bodyA := recA[hdrSize:]
	// A type 3 record, whose header count follows the key at offset 35.
	bodyL := encodeLegacy(recScheduleV3, 1, due.UnixNano(), int64(time.Minute), "s", "k",
		legacyFields{envelope.Headers{{Name: "h", Value: []byte("v")}}, []byte("p")})[hdrSize:]
	tests := []struct {
		name   string
		data   []byte
		off    int64
		reason string
	}{
		{"empty file", nil, 0, "file too short for the header"},
		{"short file", magic[:5], 0, "file too short for the header"},
		{"bad magic", cat([]byte("SDRETRY2"), recA), 0, `bad header "SDRETRY2", want "SDRETRY1"`},
		{"body checksum", cat(magic, flip(recA, hdrSize+20), recB), 8, "record body checksum mismatch"},
		{"body checksum field", cat(magic, flip(recA, 9), recB), 8, "record body checksum mismatch"},
		{"length", cat(magic, flip(recA, 0), recB), 8, "record header checksum mismatch"},
		{"length checksum", cat(magic, flip(recA, 5), recB), 8, "record header checksum mismatch"},
		{"length at the tail", cat(magic, recA, flip(recB, 1)), afterA, "record header checksum mismatch"},
		{"empty record", cat(magic, raw(), recB), 8, "empty record"},
		{"unknown type", cat(magic, raw(9, 1, 0, 0, 0, 0, 0, 0, 0), recB), 8, "unknown record type 9"},
		{"truncated field", cat(magic, raw(bodyA[:30]...)), 8, "truncated field"},
		{"trailing bytes", cat(magic, raw(append(bytes.Clone(bodyA), 0)...)), 8, "trailing bytes"},
		{"record length too large", cat(magic, raw(cat(bodyA[:35], []byte{0xff, 0xff, 0, 0}, bodyA[39:])...)), 8, "truncated field"},
		{"header count too large", cat(magic, raw(cat(bodyL[:35], []byte{0xff, 0xff, 0, 0}, bodyL[39:])...)), 8, "truncated field"},
		{"negative delay", cat(magic, raw(cat(bodyA[:17], []byte{0, 0, 0, 0, 0, 0, 0, 0x80}, bodyA[25:])...), recB), 8, "negative delay"},
		{"scheduled twice", cat(magic, recA, recA), afterA, "id 1 scheduled twice"},
		{"done for an unknown id", cat(magic, recA, encodeDone(7)), afterA, "done record for id 7, which is not pending"},
		{"done twice", cat(magic, recA, encodeDone(1), encodeDone(1)), afterA + hdrSize + doneBodySize, "done record for id 1, which is not pending"},
		{"id out of range", cat(magic, sched(1<<64-1)), 8, "record id out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, path := writeSpool(t, tt.data)
			_, err := Open(Options{Dir: dir, Fire: (&recorder{t: t}).fire})
			want := fmt.Sprintf("retrytimer: corrupt spool %s at offset %d: %s "+
				"(move the file aside to start with an empty spool; the copies pending in it are then lost)", path, tt.off, tt.reason)
			if err == nil || err.Error() != want {
				t.Errorf("Open error:\n got %v\nwant %s", err, want)
			}
			if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, tt.data) {
				t.Errorf("Open changed a corrupt spool (err %v)", err)
			}
		})
	}
}

func TestSpoolCompaction(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SpoolName)
	r := &recorder{t: t}
	const minBytes = 4096
	q, err := Open(Options{Dir: dir, Fire: r.fire, CompactMinBytes: minBytes})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var live []string
	for i := range 10 {
		key := fmt.Sprintf("live-%d", i)
		live = append(live, key)
		if err := q.Schedule(testCopy(key, now.Add(time.Hour+time.Duration(i)), 100), now.Add(time.Hour+time.Duration(i))); err != nil {
			t.Fatal(err)
		}
	}
	const n = 1000
	for i := range n {
		due := now.Add(-time.Hour + time.Duration(i))
		if err := q.Schedule(testCopy(fmt.Sprintf("fired-%d", i), due, 200), due); err != nil {
			t.Fatal(err)
		}
	}
	fireDue(t, q)
	if got := len(r.all()); got != n {
		t.Fatalf("fired %d, want %d", got, n)
	}
	liveBytes := q.sp.live
	size := fileSize(t, path)
	// What is left besides the pending records is less than one compaction's
	// worth plus the record that crossed it.
	if size != q.sp.size || size >= int64(len(fileMagic))+liveBytes+minBytes+300 {
		t.Errorf("spool size %d (tracked %d) with %d live bytes, want below %d", size, q.sp.size, liveBytes,
			int64(len(fileMagic))+liveBytes+minBytes+300)
	}
	if got := pendingKeys(t, q); !slices.Equal(got, live) {
		t.Errorf("pending after compaction %v, want %v", got, live)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, Options{Dir: dir, Fire: r.fire})
	if got := pendingKeys(t, q); !slices.Equal(got, live) {
		t.Errorf("pending after reopening %v, want %v", got, live)
	}
	for _, e := range q.h {
		if e.id >= q.nextID {
			t.Errorf("next id %d after reopening, but id %d is pending", q.nextID, e.id)
		}
	}

	// Once everything has fired the spool is back to its header.
	dir = t.TempDir()
	path = filepath.Join(dir, SpoolName)
	q = mustOpen(t, Options{Dir: dir, Fire: r.fire, CompactMinBytes: 1})
	for i := range 100 {
		mustSchedule(t, q, fmt.Sprintf("x-%d", i), now.Add(-time.Duration(i)))
	}
	fireDue(t, q)
	if got := fileSize(t, path); got != int64(len(fileMagic)) || q.Pending() != 0 {
		t.Errorf("spool size %d with %d pending, want %d and 0", got, q.Pending(), len(fileMagic))
	}
}

func TestSpoolCompactionFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SpoolName)
	var logs testutil.SyncBuffer
	r := &recorder{t: t}
	q := mustOpen(t, Options{Dir: dir, Fire: r.fire, CompactMinBytes: 1000, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	// A directory where the temporary file goes makes compaction fail.
	block := durable.TempPath(path)
	if err := os.MkdirAll(filepath.Join(block, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range 20 {
		mustSchedule(t, q, fmt.Sprintf("a-%d", i), now.Add(-time.Hour))
	}
	fireDue(t, q)
	if !strings.Contains(logs.String(), "spool compaction failed") || !strings.Contains(logs.String(), "is a directory") {
		t.Errorf("log %q, want a compaction failure", logs.String())
	}
	failedAt := fileSize(t, path)
	if failedAt < 1000 {
		t.Fatalf("spool size %d, want at least 1000 so that compaction was tried", failedAt)
	}
	// The queue goes on; compaction is tried again once another
	// CompactMinBytes of fired copies have accumulated.
	if err := os.RemoveAll(block); err != nil {
		t.Fatal(err)
	}
	mustSchedule(t, q, "b", now.Add(-time.Hour))
	fireDue(t, q)
	if got := fileSize(t, path); got <= failedAt {
		t.Errorf("spool size %d, want it to grow past %d before the next try", got, failedAt)
	}
	for i := range 40 {
		mustSchedule(t, q, fmt.Sprintf("c-%d", i), now.Add(-time.Hour))
	}
	fireDue(t, q)
	if got := fileSize(t, path); got >= 1000+300 || len(r.all()) != 61 {
		t.Errorf("spool size %d after %d fires, want compacted", got, len(r.all()))
	}
}

func TestOpenRemovesLeftoverTemp(t *testing.T) {
	dir := t.TempDir()
	q := mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire})
	mustSchedule(t, q, "a", time.Now().Add(time.Hour))
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	tmp := durable.TempPath(filepath.Join(dir, SpoolName))
	if err := os.WriteFile(tmp, []byte("half a compaction"), 0o600); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire})
	if got := pendingKeys(t, q); !slices.Equal(got, []string{"a"}) {
		t.Errorf("pending %v, want [a]", got)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("temporary file left after Open: %v", err)
	}
	if st, err := os.Stat(filepath.Join(dir, SpoolName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("spool file mode: %v, %v", st.Mode(), err)
	}
}

// TestSpoolWriteFailure checks that a failed spool write whose partial
// record cannot be removed fails the queue for good, so that a partial write
// can only be a torn tail.
func TestSpoolWriteFailure(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, Fire: (&recorder{t: t}).fire})
	if err != nil {
		t.Fatal(err)
	}
	mustSchedule(t, q, "a", time.Now().Add(-time.Second))
	q.sp.f.Close() // every later write fails
	path := filepath.Join(dir, SpoolName)
	want := "retrytimer: spool: write left a partial record that could not be removed: write " + path +
		": file already closed\ntruncate " + path + ": file already closed"
	if err := q.Schedule(testCopy("b", time.Now(), 0), time.Now()); err == nil || err.Error() != want {
		t.Errorf("Schedule: %v, want %s", err, want)
	}
	if err := q.Schedule(testCopy("c", time.Now(), 0), time.Now()); err == nil || err.Error() != want {
		t.Errorf("second Schedule: %v, want %s", err, want)
	}
	if err := q.Run(context.Background()); err == nil || err.Error() != want {
		t.Errorf("Run: %v, want %s", err, want)
	}
	if abandoned, err := q.Drain(context.Background()); abandoned != 1 || err == nil || err.Error() != want {
		t.Errorf("Drain: %d abandoned, %v; want 1 and %s", abandoned, err, want)
	}
	if err := q.Close(); err == nil || err.Error() != "retrytimer: close spool: close "+path+": file already closed" {
		t.Errorf("Close: %v", err)
	}
	q = mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire})
	if got := pendingKeys(t, q); !slices.Equal(got, []string{"a"}) {
		t.Errorf("pending after reopening %v, want [a]", got)
	}
}

// smallDisk returns a directory on a filesystem of its own of 64 KiB (a
// tmpfs, unmounted at the end of the test), to be filled; it skips the
// test where one cannot be mounted.
func smallDisk(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs for a full disk needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s)", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fillDisk fills the filesystem of dir with a file, whose path it
// returns: removing it makes the room again.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for {
		if _, err := f.Write(make([]byte, 512)); err != nil {
			return filler // the disk is full
		}
	}
}

// TestSpoolFullDisk fills the filesystem under the spool: a Schedule that
// does not fit fails and leaves the spool as it was, and once space returns
// the queue schedules and fires again.
func TestSpoolFullDisk(t *testing.T) {
	dir := smallDisk(t)
	rec := &recorder{t: t}
	q := mustOpen(t, Options{Dir: dir, Fire: rec.fire})
	filler := fillDisk(t, dir)
	big := testCopy("full", time.Now(), 0)
	big.Record = make([]byte, 8<<10)
	if err := q.Schedule(big, time.Now()); err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("Schedule on a full disk: %v, want no space left on device", err)
	}
	os.Remove(filler)
	mustSchedule(t, q, "after", time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for q.Pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after space returned: %v", err)
	}
	if q.Pending() != 0 {
		t.Fatalf("%d copies still pending after space returned", q.Pending())
	}
}

// TestDurableBeforeDone: a fired copy is recorded as done in the spool only
// after Options.Durable returned nil, once for the copies that fired
// together: a spool as it was on disk while Durable ran (a power loss
// then) still holds them, and fires them again. While Durable fails, they
// stay pending in the spool, and it is tried again.
func TestDurableBeforeDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var (
			mu        sync.Mutex
			calls     int
			failing   bool
			atDurable []string // the spool's pending copies, as a restart then would see them
		)
		q := mustOpen(t, Options{Dir: dir, Fire: (&recorder{t: t}).fire, RetryBackoff: time.Second, Durable: func() error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			atDurable = spoolPending(t, dir)
			if failing {
				return errors.New("sync failed")
			}
			return nil
		}})
		state := func() (int, []string) {
			mu.Lock()
			defer mu.Unlock()
			return calls, atDurable
		}
		setFailing := func(v bool) {
			mu.Lock()
			failing = v
			mu.Unlock()
		}
		now := time.Now()
		for _, k := range []string{"a", "b", "c"} {
			mustSchedule(t, q, k, now.Add(time.Second))
		}
		mustSchedule(t, q, "later", now.Add(time.Hour))
		stop := runQueue(t, q)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n, seen := state(); n != 1 || !slices.Equal(seen, []string{"a", "b", "c", "later"}) {
			t.Errorf("Durable called %d times for three copies fired together, seeing %q pending in the spool; "+
				"want once, with a, b, c and later pending (nothing recorded done yet)", n, seen)
		}
		if got, want := spoolPending(t, dir), []string{"later"}; !slices.Equal(got, want) {
			t.Errorf("spool after Durable: %q pending, want %q", got, want)
		}

		// Durable fails: the copy stays pending in the spool, tried again
		// after RetryBackoff until it passes.
		setFailing(true)
		mustSchedule(t, q, "d", time.Now().Add(time.Second))
		time.Sleep(3500 * time.Millisecond)
		synctest.Wait()
		if n, _ := state(); n < 3 {
			t.Errorf("Durable called %d times in all, want it tried again while it fails", n)
		}
		if got, want := spoolPending(t, dir), []string{"d", "later"}; !slices.Equal(got, want) {
			t.Errorf("spool while Durable fails: %q pending, want %q", got, want)
		}
		setFailing(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got, want := spoolPending(t, dir), []string{"later"}; !slices.Equal(got, want) {
			t.Errorf("spool once Durable passes: %q pending, want %q", got, want)
		}
		stop()
	})
}

// spoolPending opens a copy of the spool in dir, as a restart would, and
// returns its pending copies' keys in due order.
func spoolPending(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, SpoolName))
	if err != nil {
		t.Fatal(err)
	}
	cp := t.TempDir()
	if err := os.WriteFile(filepath.Join(cp, SpoolName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := Open(Options{Dir: cp, Fire: func(context.Context, Copy) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	return pendingKeys(t, q)
}

// TestUndoneSurvivesCompaction: copies fired while Durable fails keep
// their schedule records through a compaction, count as pending, and are
// recorded done once Durable passes; the spool then opens cleanly.
func TestUndoneSurvivesCompaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var failing atomic.Bool
		failing.Store(true)
		var mu sync.Mutex
		var atDurable []string
		q, err := Open(Options{Dir: dir, Fire: (&recorder{t: t}).fire, CompactMinBytes: 500, RetryBackoff: time.Second,
			Durable: func() error {
				mu.Lock()
				atDurable = spoolPending(t, dir)
				mu.Unlock()
				if failing.Load() {
					return errors.New("sync failed")
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, k := range []string{"a", "b", "c"} {
			if err := q.Schedule(testCopy(k, now, 1000), now); err != nil {
				t.Fatal(err)
			}
		}
		mustSchedule(t, q, "later", now.Add(time.Hour))
		stop := runQueue(t, q)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		stop()
		if got := q.Pending(); got != 4 {
			t.Errorf("Pending = %d after three copies fired that are not durable, want 4", got)
		}
		// A second run begins with a compaction check; Durable still fails.
		dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if n, err := q.Drain(dctx); n != 4 || err != nil {
			t.Errorf("Drain = %d, %v; want 4 pending, no error", n, err)
		}
		cancel()
		mu.Lock()
		seen := atDurable
		mu.Unlock()
		if want := []string{"a", "b", "c", "later"}; !slices.Equal(seen, want) {
			t.Errorf("the spool on disk while Durable ran held %q, want %q", seen, want)
		}
		failing.Store(false)
		dctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
		q.Drain(dctx)
		cancel()
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		if got, want := spoolPending(t, dir), []string{"later"}; !slices.Equal(got, want) {
			t.Errorf("the spool once Durable passed: %q pending, want %q", got, want)
		}
	})
}

// TestNothingFiresWhileDurableFails: after Durable failed, no copy fires
// until a later try of it passes.
func TestNothingFiresWhileDurableFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		r := &recorder{t: t}
		q := mustOpen(t, Options{Dir: t.TempDir(), Fire: r.fire, RetryBackoff: time.Second,
			Durable: func() error { calls.Add(1); return errors.New("sync failed") }})
		now := time.Now()
		mustSchedule(t, q, "first", now.Add(time.Second))
		for range 300 {
			mustSchedule(t, q, "x", now.Add(1500*time.Millisecond))
		}
		stop := runQueue(t, q)
		defer stop()
		time.Sleep(5200 * time.Millisecond)
		synctest.Wait()
		if n := len(r.all()); n != 1 || calls.Load() < 4 {
			t.Errorf("%d copies fired, Durable tried %d times, in 5s of failing Durable; want 1 fired and a try each second", n, calls.Load())
		}
	})
}

// TestSpoolRemoved: a spool removed while the queue runs (a state
// directory cleaned by hand) is written again, with the copies pending,
// within spoolCheckEvery or at the stop, and says so: the next start has
// them. Another file put at its path (another streamd's, which took the
// directory) is left alone, and no compaction replaces it.
func TestSpoolRemoved(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wait    time.Duration // before the stop
		other   bool          // another file at the path
		pending int           // after a restart
	}{
		{"checked", spoolCheckEvery, false, 2},
		{"at the stop", 0, false, 2},
		{"another file", spoolCheckEvery, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, SpoolName)
				var logs testutil.SyncBuffer
				r := &recorder{t: t}
				q, err := Open(Options{Dir: dir, Fire: r.fire, CompactMinBytes: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				if err != nil {
					t.Fatal(err)
				}
				later := time.Now().Add(time.Hour)
				mustSchedule(t, q, "a", later)
				mustSchedule(t, q, "b", later)
				for _, key := range []string{"now-1", "now-2", "now-3"} { // fired: more dead bytes than live, for a compaction
					mustSchedule(t, q, key, time.Now())
				}
				stop := runQueue(t, q)
				synctest.Wait() // the due copies fired, and compacted away
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if tc.other {
					other := mustOpen(t, Options{Dir: dir, Fire: r.fire})
					if err := other.Close(); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(tc.wait)
				synctest.Wait()
				if _, err := os.Stat(path); tc.wait > 0 && err != nil {
					t.Errorf("spool %v %s after its removal, while the queue runs", err, tc.wait)
				}
				stop()
				if err := q.Close(); err != nil {
					t.Fatal(err)
				}
				if written := strings.Contains(logs.String(), msgSpoolRemoved+"; it is written again"); written == tc.other {
					t.Errorf("log %q: the spool written again %v, want %v", logs.String(), written, !tc.other)
				}
				again := mustOpen(t, Options{Dir: dir, Fire: r.fire})
				if got := again.Pending(); got != tc.pending {
					t.Errorf("%d copies pending after a restart, want %d", got, tc.pending)
				}
			})
		})
	}
}

// TestSpoolRemovedWhileBusy: a spool removed while due copies keep the
// queue firing is written again within spoolCheckEvery all the same.
func TestSpoolRemovedWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, SpoolName)
		slow := func(context.Context, Copy) error { time.Sleep(10 * time.Millisecond); return nil }
		q := mustOpen(t, Options{Dir: dir, Fire: slow})
		for i := range 3000 { // 30 s of firing
			mustSchedule(t, q, fmt.Sprintf("c-%d", i), time.Now())
		}
		stop := runQueue(t, q)
		defer stop()
		time.Sleep(time.Second)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		time.Sleep(spoolCheckEvery + time.Second)
		if _, err := os.Stat(path); err != nil {
			t.Errorf("spool %v %s after its removal, while copies fire", err, spoolCheckEvery+time.Second)
		}
		if q.Pending() == 0 {
			t.Fatal("no copy pending any more: the queue was not busy")
		}
	})
}

// TestSpoolFullDiskDoneRecords fills the filesystem under the spool while
// copies are due: the done records of those that fired cannot all be
// written. The queue does not fail (the daemon would stop, and fire them
// all again at each restart): nothing more fires until they are written,
// which happens once space returns, and each copy fires once.
func TestSpoolFullDiskDoneRecords(t *testing.T) {
	dir := smallDisk(t)
	rec := &recorder{t: t}
	var logs testutil.SyncBuffer
	var stuckMu sync.Mutex
	var stuck []string // what Options.Stuck was told, each change
	tell := func(err error) {
		stuckMu.Lock()
		defer stuckMu.Unlock()
		s := fmt.Sprint(err)
		if len(stuck) == 0 || stuck[len(stuck)-1] != s {
			stuck = append(stuck, s)
		}
	}
	q := mustOpen(t, Options{Dir: dir, Fire: rec.fire, RetryBackoff: 10 * time.Millisecond, Stuck: tell, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	// More done records than the slack of the spool's last page holds.
	const n = 2 * doneBatch
	now := time.Now()
	for i := range n {
		mustSchedule(t, q, fmt.Sprint("c", i), now)
	}
	filler := fillDisk(t, dir)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	await := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("Run ended %s: %v", what, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	await("with the disk full", func() bool { return strings.Contains(logs.String(), "cannot record the copies fired as done") })
	fires := len(rec.all())
	// Several backoffs with the disk full: the queue tries again, and
	// neither fails nor fires more.
	select {
	case err := <-done:
		t.Fatalf("Run ended with the disk full: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if got := len(rec.all()); got != fires || fires == 0 || fires == n {
		t.Fatalf("%d fires, then %d while the done records of the first could not be written; want some, and no more", fires, got)
	}

	os.Remove(filler)
	await("after space returned", func() bool { return len(spoolPending(t, dir)) == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	seen := make(map[string]int)
	for _, f := range rec.all() {
		seen[f.key]++
	}
	for i := range n {
		if k := fmt.Sprint("c", i); seen[k] != 1 {
			t.Errorf("copy %s fired %d times, want once", k, seen[k])
		}
	}
	if l := logs.String(); strings.Count(l, "cannot record the copies fired as done") != 1 || !strings.Contains(l, "records the copies fired as done again") {
		t.Errorf("log: %s\nwant the trouble once (its lines are limited) and its end", l)
	}
	stuckMu.Lock()
	defer stuckMu.Unlock()
	if len(stuck) != 2 || !strings.Contains(stuck[0], "no space left on device") || stuck[1] != "<nil>" {
		t.Errorf("Options.Stuck was told %q, want the full disk, then nil", stuck)
	}
}
