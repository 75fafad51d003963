package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
)

// TestFileSwitchWithWorkers: a subscription with workers meets a new file
// (the old one replaced) while workers still store the old file's
// positions; the position stored in the end is the new file's, at its end.
// Under the race detector it also checks that the reader replaces its
// file and tracker only once the workers are done with them.
func TestFileSwitchWithWorkers(t *testing.T) {
	e := newRunEnv(t, "rotation_grace = \"0s\"\n"+runSub("s", "k", "start_at = \"beginning\"\nconcurrency = 2"))
	e.put("k", nil, "a0", "a1", "a2")
	rec := newRecorder(nil)
	e.start(map[string]handler.Handler{"s": rec})
	rec.waitN(t, 3)
	created := e.rotate("k", "b0")
	rec.waitN(t, 4)
	size := e.fileSize()
	storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.File.CreatedAtMs == created && p.Offset == size })
	// The old file's records in any order (two workers), then the new one's.
	got := rec.seen()
	slices.Sort(got[:3])
	if !slices.Equal(got, []string{"1/1/a0", "2/1/a1", "3/1/a2", "1/1/b0"}) {
		t.Errorf("delivered %q, want a0 a1 a2 (in any order), then b0", got)
	}
}

// rotate renames the env's stream file away (orders.ss.1) and a new one to
// its path, with records of key, and returns its creation time.
func (e *runEnv) rotate(key string, payloads ...string) uint64 {
	e.t.Helper()
	created := uint64(time.Now().UnixMilli()) + 7 // another file
	next := filepath.Join(e.dir, "next.ss")
	w, err := streamfile.OpenWriter(next, streamfile.CreateOptions{Create: true, Header: streamfile.Header{
		FileName: "orders.ss", CreatedAtMs: created, BeaconInterval: 1024}})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range payloads {
		if err := w.Publish([]streamfile.Frame{{Key: key, Payload: []byte(p), TimestampMs: 1}}); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := errors.Join(w.Close(), os.Rename(e.stream, e.stream+".1"), os.Rename(next, e.stream)); err != nil {
		e.t.Fatal(err)
	}
	return created
}

// TestFileSwitchPastRecordInHand: with workers, a record of the old file
// still in its handler when the path names a new file does not hold back
// the new file's records: they are delivered meanwhile, while the stored
// position stays before the record in hand, in the old file; once it
// settles, the position moves to the new file's end. A stop meanwhile
// delivers the record in hand again at the next start.
func TestFileSwitchPastRecordInHand(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("stop %v", stop), func(t *testing.T) {
			e := newRunEnv(t, "rotation_grace = \"0s\"\n"+runSub("s", "k", "start_at = \"beginning\"\nconcurrency = 2"))
			e.shutdownTimeout = "50ms"
			e.put("k", nil, "a0", "a1", "a2")
			release := make(chan struct{})
			var once sync.Once
			rec := newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
				if string(d.Payload) == "a1" {
					first := false
					once.Do(func() { first = true })
					if first {
						return heldUntil(ctx, release)
					}
				}
				return ack
			})
			r := e.start(map[string]handler.Handler{"s": rec})
			rec.waitN(t, 3) // a1 in hand
			inHand := storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.Offset > streamfile.HeaderSize })
			created := e.rotate("k", "b0", "b1")
			rec.waitN(t, 5)
			time.Sleep(200 * time.Millisecond) // commits of a position that must not be stored
			if p := storedPosition(t, e, "s"); p.File != inHand.File || p.Offset != inHand.Offset {
				t.Fatalf("stored %+v while a1 is in hand, want %+v, before it in the old file", p, inHand)
			}
			if stop {
				if err := r.stop(); err != nil {
					t.Fatal(err)
				}
				again := newRecorder(nil)
				e.start(map[string]handler.Handler{"s": again})
				again.waitN(t, 3)
				// a2 settled after a1: the stop kept it. The new file's
				// records settled before a1 are delivered again.
				got := again.seen()
				slices.Sort(got) // two workers, and the new file's records need not wait for a1
				if !slices.Equal(got, []string{"1/1/b0", "2/1/a1", "2/1/b1"}) {
					t.Fatalf("after the restart, delivered %q, want a1, and b0 and b1 again", got)
				}
				return
			}
			close(release)
			size := e.fileSize()
			storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.File.CreatedAtMs == created && p.Offset == size })
		})
	}
}

// TestRotatedFileClosed: once every record of a file rotated away has
// settled, and the subscription reads the next, no descriptor of streamd's
// is left on it: a rotated file removed (compressed) gives its disk space
// back, with or without a record in hand at the switch (the file behind
// then), and though no copy was appended since (the stream's appender
// follows the path at each commit interval).
func TestRotatedFileClosed(t *testing.T) {
	for _, inHand := range []bool{false, true} {
		t.Run(fmt.Sprintf("record in hand %v", inHand), func(t *testing.T) {
			e := newRunEnv(t, "rotation_grace = \"0s\"\n"+runSub("s", "k", "start_at = \"beginning\"\nconcurrency = 2"))
			e.put("k", nil, "a0", "a1", "a2")
			release := make(chan struct{})
			rec := newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
				if inHand && string(d.Payload) == "a1" && d.Attempt == 1 {
					return heldUntil(ctx, release)
				}
				return ack
			})
			e.start(map[string]handler.Handler{"s": rec})
			rec.waitN(t, 3)
			if !inHand {
				storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.Offset == e.fileSize() })
			}
			created := e.rotate("k", "b0", "b1")
			rec.waitN(t, 5)
			if err := os.Remove(e.stream + ".1"); err != nil { // compressed, say
				t.Fatal(err)
			}
			close(release)
			size := e.fileSize()
			storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.File.CreatedAtMs == created && p.Offset == size })
			removed := e.stream + ".1 (deleted)"
			waitFor(t, "the rotated file closed", func() bool { return descriptorsOf(t, removed) == 0 })
		})
	}
}

// heldUntil answers ack once release is closed: a delivery in hand until
// then; or a cancelled failure when ctx ends first (a stop).
func heldUntil(ctx context.Context, release <-chan struct{}) handler.Outcome {
	select {
	case <-release:
		return ack
	case <-ctx.Done():
		return handler.Failed(handler.FailureCanceled, ctx.Err())
	}
}

// descriptorsOf counts this process's descriptors of the file named so in
// /proc/self/fd.
func descriptorsOf(t *testing.T, name string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == name {
			n++
		}
	}
	return n
}

// TestTruncatedInPlace: a file truncated to its header and written again
// under the same header (so the same identity) is read again from its
// beginning, and the subscription goes on: its new records are delivered
// and its position follows them.
func TestTruncatedInPlace(t *testing.T) {
	e := newRunEnv(t, runSub("s", "k", "start_at = \"beginning\""))
	e.put("k", nil, "a0", "a1", "a2", "a3", "a4")
	rec := newRecorder(nil)
	e.start(map[string]handler.Handler{"s": rec})
	rec.waitN(t, 5)
	before := storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.Offset == e.fileSize() })

	if err := os.Truncate(e.stream, streamfile.HeaderSize); err != nil {
		t.Fatal(err)
	}
	e.put("k", nil, "b0")
	rec.waitN(t, 6)
	size := e.fileSize()
	after := storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.Offset == size })
	if after.File != before.File {
		t.Errorf("stored file %+v, want the same identity %+v", after.File, before.File)
	}
	if got := rec.seen(); got[5] != "1/1/b0" {
		t.Errorf("delivered %q, want b0 last", got)
	}
}

// TestResumeAfterDeviceChange: a position stored by the previous streamd,
// in a sidecar of version 1 that names the file's device number, applies
// to the file whatever its device number is now (a reboot may change it):
// offsets show counts the lag, and the subscription resumes after the
// records the position passes rather than reading the file again from its
// beginning. The next commit stores the position without the device
// number.
func TestResumeAfterDeviceChange(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delta uint64 // added to the device number the sidecar names
	}{
		{"same device number", 0},
		{"device number changed by a reboot", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRunEnv(t, runSub("s", "k", "start_at = \"beginning\""))
			e.put("k", nil, "a0", "a1")
			stored := e.fileSize()
			e.put("k", nil, "a2")
			f, err := os.Open(e.stream)
			if err != nil {
				t.Fatal(err)
			}
			h, err := streamfile.ReadHeader(f)
			var st syscall.Stat_t
			if err := errors.Join(err, syscall.Fstat(int(f.Fd()), &st), f.Close()); err != nil {
				t.Fatal(err)
			}
			sidecar := fmt.Sprintf(`{"version": 1, "subscriptions": {"s": {"stream": %q, `+
				`"file": {"dev": %d, "ino": %d, "file_name": %q, "created_at_ms": %d}, `+
				`"offset": %d, "last_seq": 2, "committed_at": "2026-12-01T00:00:00Z"}}}`,
				e.stream, st.Dev+tc.delta, st.Ino, h.FileName, h.CreatedAtMs, stored)
			state := filepath.Join(e.dir, "state")
			if err := errors.Join(os.MkdirAll(state, 0o750), os.WriteFile(filepath.Join(state, offsets.SidecarName), []byte(sidecar), 0o600)); err != nil {
				t.Fatal(err)
			}

			size := e.fileSize()
			reports, err := Positions(e.load())
			if err != nil {
				t.Fatal(err)
			}
			if len(reports) != 1 || reports[0].Lag != size-stored || reports[0].Note != "" {
				t.Errorf("offsets show: %+v, want a lag of %d and no note", reports, size-stored)
			}

			rec := newRecorder(nil)
			e.start(map[string]handler.Handler{"s": rec})
			p := storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.Offset == size })
			if want := (streamfile.Identity{Ino: st.Ino, FileName: h.FileName, CreatedAtMs: h.CreatedAtMs}); p.File != want {
				t.Errorf("stored file %+v, want %+v", p.File, want)
			}
			if got := rec.seen(); !slices.Equal(got, []string{"3/1/a2"}) {
				t.Errorf("delivered %q, want a2 only", got)
			}
		})
	}
}

// TestFileID pins the file identity that deliveries carry, and so the
// Nats-Msg-Id of a record: it depends on the inode number and the header
// only, not on the device number, which a reboot may change, and must not
// change from one streamd version to the next.
func TestFileID(t *testing.T) {
	for _, tc := range []struct {
		file streamfile.Identity
		want string
	}{
		{streamfile.Identity{Ino: 1311020, FileName: "orders", CreatedAtMs: 1694767177437}, "75b76d0e4735e00dfc744cd6"},
		{streamfile.Identity{Ino: 1311021, FileName: "orders", CreatedAtMs: 1694767177437}, "5bc788649a757aeffbb8564f"},
		{streamfile.Identity{Ino: 1311020, FileName: "orders", CreatedAtMs: 1694767177438}, "c3eea2e56fe5ecc654efa5fd"},
		{streamfile.Identity{Ino: 1311020, FileName: "orders.ss", CreatedAtMs: 1694767177437}, "7911956ec158a5e95565e376"},
	} {
		s := &subscription{file: tc.file}
		if got := s.fileID(); got != tc.want {
			t.Errorf("fileID of %+v = %q, want %q", tc.file, got, tc.want)
		}
	}
}

// storedPosition returns the subscription's committed position.
func storedPosition(t *testing.T, e *runEnv, sub string) offsets.Position {
	t.Helper()
	stored, err := offsets.Load(filepath.Join(e.dir, "state"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return stored[sub]
}

// storedPositionWhen waits until the subscription's committed position
// satisfies cond, and returns it.
func storedPositionWhen(t *testing.T, e *runEnv, sub string, cond func(offsets.Position) bool) offsets.Position {
	t.Helper()
	var p offsets.Position
	waitFor(t, "the stored position", func() bool {
		p = storedPosition(t, e, sub)
		return cond(p)
	})
	return p
}

// TestStopSaysCommitted: a graceful stop ends with a line that says the
// positions are committed and how many retry copies wait in the spool.
func TestStopSaysCommitted(t *testing.T) {
	e := newRunEnv(t, runSub("s", "k", "start_at = \"beginning\""))
	e.put("k", nil, "a0")
	rec := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"s": rec})
	rec.waitN(t, 1)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	rs := r.logs.with("stopped; positions committed")
	if len(rs) != 1 || rs[0].attrs["retries_pending"] != "0" {
		t.Errorf("stop lines %v, want one with retries_pending 0", rs)
	}
}

// blindAck acks every record without reading it, as discard does.
type blindAck struct{}

func (blindAck) Handle(context.Context, *handler.Delivery) handler.Outcome { return ack }
func (blindAck) Blind() bool                                               { return true }

// TestIdleSubscriptionKeepsNoRecord: once its records are settled, a
// subscription keeps none of them alive, nor what it decoded of them:
// neither a worker's copy of the last record it delivered (each of the
// workers', up to concurrency records), nor the read-ahead's memory that
// an inline delivery is made in, nor the envelope's payload decoded for a
// handler that reads it. With four records of 8 MiB, the live heap after
// they are settled is back within a few MiB of what it was before the
// daemon started.
func TestIdleSubscriptionKeepsNoRecord(t *testing.T) {
	const size, n = 4 << 20, 4
	reads := handler.HandlerFunc(func(_ context.Context, d *handler.Delivery) handler.Outcome {
		if len(d.Payload) != size {
			return handler.Outcome{Kind: handler.OutcomeDrop}
		}
		return ack
	})
	// An endpoint of batches that acks each record, keeping none.
	acks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		for range bytes.Count(body, []byte("\n")) {
			fmt.Fprintln(w, `{"outcome":"ack"}`)
		}
	}))
	defer acks.Close()
	for _, tc := range []struct {
		name string
		sub  string
		h    handler.Handler // nil: the configured one
	}{
		{"inline, reading", runSub("s", "k", "start_at = \"beginning\""), reads},
		{"workers, reading", runSub("s", "k", "start_at = \"beginning\"\nconcurrency = 4"), reads},
		{"workers, blind", runSub("s", "k", "start_at = \"beginning\"\nconcurrency = 4"), blindAck{}},
		{"batches", strings.ReplaceAll(httpSub(acks.URL, "start_at = \"beginning\"\nconcurrency = 2", "batch_max_records = 2"), "billing", "s"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRunEnv(t, strings.ReplaceAll(tc.sub, `key = "orders"`, `key = "k"`))
			w, err := streamfile.OpenWriter(e.stream, streamfile.CreateOptions{Create: true, Header: streamfile.Header{
				FileName: "orders.ss", CreatedAtMs: uint64(time.Now().UnixMilli()), BeaconInterval: streamfile.DefaultBeaconInterval}})
			if err != nil {
				t.Fatal(err)
			}
			record := envelope.Encode(envelope.Headers{{Name: "x-n", Value: []byte("1")}}, bytes.Repeat([]byte("p"), size), false)
			for range n {
				if err := w.Publish([]streamfile.Frame{{Key: "k", Payload: record}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			recordSize := len(record)
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			before := ms.HeapAlloc
			handlers := map[string]handler.Handler{}
			if tc.h != nil {
				handlers["s"] = tc.h
			}
			r := e.start(handlers)
			end := e.fileSize()
			storedPositionWhen(t, e, "s", func(p offsets.Position) bool { return p.Offset == end })
			if got := r.metric("s", "ack"); got != n {
				t.Fatalf("%v records acked, want %d", got, n)
			}
			// The last deliveries end just after their records are
			// settled: the heap is looked at again until then.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				runtime.GC()
				runtime.ReadMemStats(&ms)
				kept := int64(ms.HeapAlloc) - int64(before)
				if kept < 6<<20 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("settled, %d records of %d bytes leave %d bytes more of live heap than before the start, want less than 6 MiB", n, recordSize, kept)
				}
			}
		})
	}
}

// TestSymlinkRetargetedWhileLagging: a symlink at the path retargeted twice
// while the subscription lags behind its read-ahead (its handler slow, the
// follower not waiting at the end of the file) reads every file, in
// order: the follower's reader looks at the path while it waits to hand
// records on.
func TestSymlinkRetargetedWhileLagging(t *testing.T) {
	e := newRunEnv(t, "rotation_grace = \"0s\"\n"+runSub("s", "k", "start_at = \"beginning\""))
	dir := e.dir
	// write makes name, a stream file of its own name, with n records of
	// 100 KiB (two fill a read-ahead batch).
	write := func(name string, created uint64, n int) {
		w, err := streamfile.OpenWriter(filepath.Join(dir, name), streamfile.CreateOptions{Create: true, Header: streamfile.Header{
			FileName: name, CreatedAtMs: created, BeaconInterval: 1024}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			p := append([]byte(fmt.Sprintf("%s/%d/", name, i)), bytes.Repeat([]byte{'x'}, 100<<10)...)
			if err := w.Publish([]streamfile.Frame{{Key: "k", Payload: p, TimestampMs: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	retarget := func(name string) {
		tmp := filepath.Join(dir, "tmp")
		if err := errors.Join(os.Symlink(name, tmp), os.Rename(tmp, e.stream)); err != nil {
			t.Fatal(err)
		}
	}
	write("a.ss", 1, 20)
	retarget("a.ss")
	release := make(chan struct{})
	rec := newRecorder(func(ctx context.Context, _ *handler.Delivery) handler.Outcome { return heldUntil(ctx, release) })
	r := e.start(map[string]handler.Handler{"s": rec})
	rec.waitN(t, 1) // the first record in hand, the read-ahead filling up
	write("b.ss", 2, 3)
	retarget("b.ss")
	waitFor(t, "the follower to see b.ss", func() bool {
		return slices.ContainsFunc(r.logs.all(), func(l logRecord) bool { return strings.HasPrefix(l.msg, "another file at the path") })
	})
	write("c.ss", 3, 2)
	retarget("c.ss")
	close(release)
	rec.waitN(t, 25)
	var got []string
	for _, d := range rec.deliveries() {
		name, _, _ := strings.Cut(string(d.Payload), "/")
		if len(got) == 0 || got[len(got)-1] != name {
			got = append(got, name)
		}
	}
	if !slices.Equal(got, []string{"a.ss", "b.ss", "c.ss"}) || len(rec.deliveries()) != 25 {
		t.Fatalf("delivered the files %q (%d records), want a.ss, b.ss and c.ss, in order (25 records)", got, len(rec.deliveries()))
	}
}
