package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// aheadFile writes frames to a new stream file and returns its path.
func aheadFile(t *testing.T, fs ...streamfile.Frame) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "a.ss")
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: "a.ss", CreatedAtMs: 1, BeaconInterval: streamfile.DefaultBeaconInterval}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if len(fs) > 0 {
		if err := w.Append(fs...); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// appendAhead appends frames to the stream file at path.
func appendAhead(t *testing.T, path string, fs ...streamfile.Frame) {
	t.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Append(fs...); err != nil {
		t.Fatal(err)
	}
}

// startAhead reads the file at opts.Path ahead until the test ends.
func startAhead(t *testing.T, ctx context.Context, opts tail.Options) *readAhead {
	t.Helper()
	ra, err := followAhead(opts)
	if err != nil {
		t.Fatal(err)
	}
	ra.start(ctx)
	t.Cleanup(ra.Close)
	return ra
}

// aheadFrames returns n frames of key k whose payloads, of sizes cycling
// through sizes, name their index.
func aheadFrames(n int, sizes ...int) []streamfile.Frame {
	fs := make([]streamfile.Frame, n)
	for i := range fs {
		p := bytes.Repeat(fmt.Appendf(nil, "%08d", i), sizes[i%len(sizes)]/8+1)
		fs[i] = streamfile.Frame{Key: "k", Payload: p[:sizes[i%len(sizes)]]}
	}
	return fs
}

// TestReadAheadKeepsRecords: every record comes, in file order, with its
// fields and payload as the follower reads them, and whether its payload
// starts with an envelope prefix, across batches filled by their record
// count, by their bytes, and by one payload larger than a batch's memory.
func TestReadAheadKeepsRecords(t *testing.T) {
	fs := append(aheadFrames(2*aheadRecords+17, 1, 50), aheadFrames(400, 700, 3000)...) // batches filled by count, then by bytes
	fs[len(fs)-100].Payload = bytes.Repeat([]byte("big"), aheadBytes)                   // three times a batch's memory
	for i := 0; i < len(fs); i += 5 {
		fs[i].Payload = append([]byte([]string{"rs1:", "rs2:", "r", "rs3:"}[i/5%4]), fs[i].Payload...)
	}
	path := aheadFile(t, fs...)
	want, err := tail.New(tail.Options{Path: path, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	ra := startAhead(t, t.Context(), tail.Options{Path: path, Replay: true})
	for i := 0; ; i++ {
		w, werr := want.Next(t.Context())
		g, gerr := ra.Next(t.Context())
		if werr != nil || gerr != nil {
			if !errors.Is(werr, io.EOF) || !errors.Is(gerr, io.EOF) || i != len(fs) {
				t.Fatalf("after %d of %d records: the follower says %v, the read-ahead %v", i, len(fs), werr, gerr)
			}
			break
		}
		if g.File != w.File || g.Offset != w.Offset || g.End != w.End || g.Key != w.Key || g.Seq != w.Seq ||
			g.TimestampMs != w.TimestampMs || g.Checksum != w.Checksum || !bytes.Equal(g.Payload, w.Payload) {
			t.Fatalf("record %d: got %+v, want %+v", i, g.Record, w.Record)
		}
		if ra.Prefixed() != envelope.Prefixed(w.Payload) {
			t.Fatalf("record %d (%.8q...): the read-ahead says prefixed %v", i, w.Payload, ra.Prefixed())
		}
	}
}

// TestReadAheadQuietFile: a record appended to a quiet file is handed on
// at once, not when a batch fills (the poll interval is an hour: only the
// follower's wait hands it on).
func TestReadAheadQuietFile(t *testing.T) {
	path := aheadFile(t)
	ra := startAhead(t, t.Context(), tail.Options{Path: path, PollInterval: time.Hour})
	for i, p := range []string{"one", "two", "three"} {
		appendAhead(t, path, streamfile.Frame{Key: "k", Payload: []byte(p)})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		rec, err := ra.Next(ctx)
		cancel()
		if err != nil || string(rec.Payload) != p {
			t.Fatalf("record %d: %v, %v; want %q", i+1, rec, err, p)
		}
	}
}

// TestReadAheadReplayReadsOn: a replay ends where its handling found the
// end, as without reading ahead (settlement.md item 21): records appended
// while it handled the records read before the end (retry copies) are
// read; the end then holds.
func TestReadAheadReplayReadsOn(t *testing.T) {
	path := aheadFile(t, aheadFrames(3, 10)...)
	ra := startAhead(t, t.Context(), tail.Options{Path: path, Replay: true})
	var got []string
	for {
		rec, err := ra.Next(t.Context())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(rec.Payload))
		if len(got) == 1 || len(got) == 4 {
			// The handling of the first record appends a copy of it; the
			// handling of that copy, another.
			appendAhead(t, path, streamfile.Frame{Key: "k", Payload: []byte(fmt.Sprintf("copy %d", len(got)))})
		}
	}
	want := []string{"0000000000", "0000000100", "0000000200", "copy 1", "copy 4"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("replay read %q, want %q", got, want)
	}
	if _, err := ra.Next(t.Context()); !errors.Is(err, io.EOF) {
		t.Fatalf("after the end: %v, want io.EOF", err)
	}
}

// TestReadAheadStops: once its context ends, Next says so even with
// records read ahead, and Close stops the reader (goleak checks it is
// gone).
func TestReadAheadStops(t *testing.T) {
	path := aheadFile(t, aheadFrames(5*aheadRecords, 10)...)
	ctx, cancel := context.WithCancel(t.Context())
	ra := startAhead(t, ctx, tail.Options{Path: path})
	if _, err := ra.Next(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := ra.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("after the end of its context: %v, want context.Canceled", err)
	}
}

// TestReadAheadLooksWhileBusy: while the reader waits to hand records on
// (the subscription lags), it looks at the path at each notification: a
// symlink retargeted twice meanwhile, much faster than the poll interval,
// does not skip the file in between.
func TestReadAheadLooksWhileBusy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	// put writes name, n frames of 100 KiB (two fill a batch), and makes
	// the path name it.
	put := func(name string, created uint64, n int) []streamfile.Frame {
		fs := aheadFrames(n, 100<<10)
		for i := range fs {
			fs[i].Payload = append([]byte(name+"/"), fs[i].Payload...)
		}
		w, err := streamfile.OpenWriter(filepath.Join(dir, name), streamfile.CreateOptions{Create: true, Header: streamfile.Header{
			FileName: name, CreatedAtMs: created, BeaconInterval: streamfile.DefaultBeaconInterval}})
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(w.Append(fs...), w.Close()); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "tmp")
		if err := errors.Join(os.Symlink(name, tmp), os.Rename(tmp, path)); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	want := put("a.ss", 1, 5) // three batches, the last at the end of the file: every batch handed on
	var log testutil.SyncBuffer
	ra := startAhead(t, t.Context(), tail.Options{Path: path, Key: "k", PollInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	waitForLog := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); strings.Count(log.String(), "another file at the path") < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the reader did not look at the path:\n%s", log.String())
			}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); len(ra.full) < aheadBatches; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the read-ahead did not fill up")
		}
	}
	want = append(want, put("b.ss", 2, 2)...)
	waitForLog(1)
	want = append(want, put("c.ss", 3, 1)...)
	waitForLog(2)
	for i, f := range want {
		rec, err := ra.Next(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rec.Payload, f.Payload) {
			t.Fatalf("record %d: %.8q, want %.8q", i, rec.Payload, f.Payload)
		}
	}
}
