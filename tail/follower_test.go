package tail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/streamfile"
)

// TestReplayVectors replays every test vector and compares the records with
// the expected decode.
func TestReplayVectors(t *testing.T) {
	edgeA, _ := vectorFrames(t, "edge-a-spliced")
	for _, tc := range []struct {
		name      string
		vector    string
		policy    CorruptPolicy
		want      []streamfile.Frame // nil: the vector's own messages
		wantErr   func(error) bool
		wantEvent Event
	}{
		{name: "sample-1", vector: "sample-1"},
		{name: "consumer", vector: "consumer"},
		{name: "quicksort", vector: "quicksort"},
		{name: "edge-a", vector: "edge-a-spliced"},
		{name: "edge-d eos", vector: "edge-d-eos"},
		{name: "edge-b torn", vector: "edge-b-truncated", want: edgeA[:8],
			wantErr: func(err error) bool { return errors.Is(err, streamfile.ErrTruncated) }},
		{name: "edge-c stop", vector: "edge-c-badcrc", policy: StopOnCorrupt, want: edgeA[:8],
			wantErr: func(err error) bool {
				var ce *streamfile.ChecksumError
				return errors.As(err, &ce) && ce.Offset == 2087 && ce.Received == 31089 && ce.Computed == 42989
			}, wantEvent: EventChecksum},
		{name: "edge-c skip", vector: "edge-c-badcrc", want: append(edgeA[:8:8], edgeA[9:]...), wantEvent: EventChecksum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				want, _ = vectorFrames(t, tc.vector)
			}
			obs := newObserver()
			fl, err := New(Options{Path: filepath.Join(vectorDir, tc.vector+".ss"), Replay: true, OnCorrupt: tc.policy, Observer: obs, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			var gotten []got
			for {
				r, err := fl.Next(context.Background())
				if err != nil {
					if tc.wantErr == nil && !errors.Is(err, io.EOF) || tc.wantErr != nil && !tc.wantErr(err) {
						t.Fatalf("after %d records: %v", len(gotten), err)
					}
					if _, again := fl.Next(context.Background()); again == nil || again.Error() != err.Error() {
						t.Fatalf("Next after %v returned %v", err, again)
					}
					break
				}
				gotten = append(gotten, copyRecord(r))
			}
			if err := sameFrames(gotten, want); err != nil {
				t.Fatal(err)
			}
			if tc.wantEvent != 0 && obs.count(tc.wantEvent) != 1 {
				t.Errorf("observer: %v, want one %s", obs, tc.wantEvent)
			}
			if obs.records != int64(len(want)) {
				t.Errorf("observer counted %d records, want %d", obs.records, len(want))
			}
		})
	}
}

// TestSkipFormatError damages a stream key so that the frame cannot be
// parsed: the follower skips to the first frame after the next beacon.
func TestSkipFormatError(t *testing.T) {
	data := readVector(t, "edge-a-spliced")
	data[1125+1] = '/' // "beta" of the frame at 1125 becomes "/eta"
	path := filepath.Join(t.TempDir(), "bad.ss")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	edgeA, offs := vectorFrames(t, "edge-a-spliced")
	for _, policy := range []CorruptPolicy{SkipCorrupt, StopOnCorrupt} {
		obs := newObserver()
		fl, err := New(Options{Path: path, Replay: true, OnCorrupt: policy, Observer: obs, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var gotten []got
		var end error
		for {
			r, err := fl.Next(context.Background())
			if err != nil {
				end = err
				break
			}
			gotten = append(gotten, copyRecord(r))
		}
		fl.Close()
		want := append(edgeA[:7:7], edgeA[8:]...) // the frame at 1125 is lost, 2087 follows the beacon at 2048
		var fe *streamfile.FormatError
		if policy == StopOnCorrupt {
			want = edgeA[:7]
			if !errors.As(end, &fe) || fe.Offset != 1125 || !strings.Contains(end.Error(), fmt.Sprintf("a reader that skips it reads on at offset %d", offs[8])) {
				t.Fatalf("stop: got %v, want a format error at 1125 naming the next frame, at %d", end, offs[8])
			}
		} else if !errors.Is(end, io.EOF) {
			t.Fatal(end)
		}
		if err := sameFrames(gotten, want); err != nil {
			t.Fatal(err)
		}
		if policy == SkipCorrupt && gotten[7].Offset != offs[8] {
			t.Fatalf("resumed at %d, want %d", gotten[7].Offset, offs[8])
		}
		if obs.count(EventFormat) != 1 {
			t.Fatalf("observer: %v", obs)
		}
	}
}

// TestTornTailEveryCut grows a file from nothing to edge-a-spliced.ss one
// byte at a time, each byte written only when the follower is about to
// wait, so that it meets every cut point: inside the header, inside every
// frame field, inside every beacon. It must deliver exactly edge-a's
// records. A second run starts on edge-b-truncated.ss at its end, where the
// incomplete frame starts.
func TestTornTailEveryCut(t *testing.T) {
	full := readVector(t, "edge-a-spliced")
	want, offs := vectorFrames(t, "edge-a-spliced")
	for _, tc := range []struct {
		name    string
		initial int
		start   string
		skip    int // records before the start
		piece   int // bytes written at a time; 0: random sizes up to 300
	}{
		{"every cut from empty", 0, "beginning", 0, 1},
		{"edge-b from its end, every cut", 3500, "end", 8, 1},
		{"edge-b from the beginning, random pieces", 3500, "beginning", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "torn.ss")
			if err := os.WriteFile(path, full[:tc.initial], 0o644); err != nil {
				t.Fatal(err)
			}
			w, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			written := tc.initial
			waits := 0
			rng := rand.New(rand.NewPCG(3, 4))
			onWait := func() {
				waits++
				if written == len(full) {
					return
				}
				n := tc.piece
				if n == 0 {
					n = 1 + rng.IntN(300)
				}
				n = min(n, len(full)-written)
				if _, err := w.Write(full[written : written+n]); err != nil {
					panic(err)
				}
				written += n
			}
			start, err := ParseStart(tc.start)
			if err != nil {
				t.Fatal(err)
			}
			fl, err := New(Options{Path: path, Start: start, PollInterval: time.Hour, Logger: testLogger(t), OnWait: onWait})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var gotten []got
			for len(gotten) < len(want)-tc.skip {
				r, err := fl.Next(ctx)
				if err != nil {
					t.Fatalf("after %d records, %d of %d bytes written: %v", len(gotten), written, len(full), err)
				}
				gotten = append(gotten, copyRecord(r))
			}
			if err := sameFrames(gotten, want[tc.skip:]); err != nil {
				t.Fatal(err)
			}
			for i, g := range gotten {
				if g.Offset != offs[tc.skip+i] {
					t.Fatalf("record %d at offset %d, want %d", i, g.Offset, offs[tc.skip+i])
				}
			}
			if tc.piece == 1 && waits < len(full)-tc.initial {
				t.Fatalf("follower waited %d times for %d bytes", waits, len(full)-tc.initial)
			}
		})
	}
}

// TestGrowth writes a file with many spliced frames into a live file in
// several patterns of write sizes while the follower reads it.
func TestGrowth(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "src.ss")
	rng := rand.New(rand.NewPCG(5, 6))
	var fs []streamfile.Frame
	for i := range 400 {
		fs = append(fs, frames([]string{"a", "bb", "ccc"}[i%3], uint64(i), 1, uint64(1_700_000_000_000+i), rng.IntN(3000))...)
	}
	writeFile(t, src, streamfile.Header{FileName: "growth.ss", CreatedAtMs: 1, BeaconInterval: 1024}, fs)
	full, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		size func(rng *rand.Rand, off int) int // the size of the write at off
	}{
		{"bytes, then larger", func(rng *rand.Rand, off int) int {
			if off < 16<<10 {
				return 1
			}
			return 1 + rng.IntN(64<<10)
		}},
		{"small", func(rng *rand.Rand, _ int) int { return 1 + rng.IntN(64) }},
		{"medium", func(rng *rand.Rand, _ int) int { return 1 + rng.IntN(4096) }},
		{"interval", func(*rand.Rand, int) int { return 1024 }},
		{"large", func(rng *rand.Rand, _ int) int { return 1 + rng.IntN(256<<10) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "live.ss")
			w, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			fl, err := New(Options{Path: path, PollInterval: time.Hour, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			writerDone := make(chan error, 1)
			go func() {
				rng := rand.New(rand.NewPCG(7, 8))
				for off := 0; off < len(full); {
					n := min(tc.size(rng, off), len(full)-off)
					if _, err := w.Write(full[off : off+n]); err != nil {
						writerDone <- err
						return
					}
					off += n
					if rng.IntN(50) == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				writerDone <- nil
			}()
			gotten := collect(t, items, len(fs), 60*time.Second)
			if err := <-writerDone; err != nil {
				t.Fatal(err)
			}
			if err := sameFrames(gotten, fs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNotifications appends frames 1 ms apart with a poll interval of an
// hour: every record arrives, woken by notifications alone.
func TestNotifications(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n.ss")
	writeFile(t, path, streamfile.Header{FileName: "n.ss", CreatedAtMs: 1, BeaconInterval: 4096}, nil)
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: time.Hour, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	fs := frames("n", 1, 200, 1, 100)
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range fs {
		if err := w.Append(fs[i]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	gotten := collect(t, items, len(fs), 20*time.Second)
	if err := sameFrames(gotten, fs); err != nil {
		t.Fatal(err)
	}
	stop()
	if n := obs.count(EventPollRead); n != 0 {
		t.Errorf("%d poll reads with an hour's poll interval", n)
	}
}

// TestPollOnly follows without notifications.
func TestPollOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.ss")
	writeFile(t, path, streamfile.Header{FileName: "p.ss", CreatedAtMs: 1, BeaconInterval: 1024}, nil)
	obs := newObserver()
	fl, err := New(Options{Path: path, PollOnly: true, PollInterval: 5 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	fs := frames("p", 1, 300, 1, 200)
	for i := 0; i < len(fs); i += 30 {
		appendFrames(t, path, fs[i:i+30])
		time.Sleep(3 * time.Millisecond)
	}
	gotten := collect(t, items, len(fs), 20*time.Second)
	if err := sameFrames(gotten, fs); err != nil {
		t.Fatal(err)
	}
	stop()
	if obs.count(EventPollRead) == 0 {
		t.Errorf("observer: %v, want poll reads", obs)
	}
	if fl.watch != nil {
		t.Error("poll-only follower set up a watch")
	}
}

// TestOverflow stalls the notification goroutine, floods the directory with
// events until the kernel queue overflows, and appends frames whose
// notifications are dropped. With an hour's poll interval, only the
// overflow's re-check can deliver them.
func TestOverflow(t *testing.T) {
	if testing.Short() {
		t.Skip("floods the notification queue")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "o.ss")
	fs := frames("o", 1, 100, 1, 50)
	writeFile(t, path, streamfile.Header{FileName: "o.ss", CreatedAtMs: 1, BeaconInterval: 1024}, fs[:10])
	stalled := make(chan struct{})
	release := make(chan struct{})
	var armed, tripped atomic.Bool
	hooks := testHooks{onEvent: func() {
		if armed.Load() && tripped.CompareAndSwap(false, true) {
			close(stalled)
			<-release
		}
	}}
	obs := newObserver()
	fl, err := newFollower(Options{Path: path, PollInterval: time.Hour, Observer: obs, Logger: testLogger(t)}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	unstall := sync.OnceFunc(func() { close(release) })
	defer unstall() // before Close, which waits for the stalled goroutine
	items, stop := follow(t, fl)
	defer stop()
	collect(t, items, 10, 10*time.Second)

	noise := [2]*os.File{}
	for i := range noise {
		f, err := os.Create(filepath.Join(dir, "noise"+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		noise[i] = f
	}
	// The watch may not be up yet: write until its goroutine stalls.
	armed.Store(true)
	deadline := time.After(10 * time.Second)
	for stalling := true; stalling; {
		if _, err := noise[0].Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-stalled:
			stalling = false
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatal("the notification goroutine never saw an event")
		}
	}
	// Alternate between two files, so that the kernel cannot merge the
	// events, well past its queue limit.
	limit := 16384
	if b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events"); err == nil {
		var n int
		if _, err := fmt.Sscan(string(b), &n); err == nil {
			limit = n
		}
	}
	for i := range 2*limit + 8192 {
		if _, err := noise[i%2].Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
	}
	appendFrames(t, path, fs[10:])
	unstall()
	gotten := collect(t, items, len(fs)-10, 30*time.Second)
	if err := sameFrames(gotten, fs[10:]); err != nil {
		t.Fatal(err)
	}
	stop()
	if obs.count(EventOverflow) == 0 {
		t.Fatalf("observer: %v, want an overflow", obs)
	}
}

// TestCancel cancels a waiting Next; a later Next goes on.
func TestCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.ss")
	fs := frames("c", 1, 3, 1, 10)
	writeFile(t, path, streamfile.Header{FileName: "c.ss", CreatedAtMs: 1, BeaconInterval: 1024}, fs[:2])
	fl, err := New(Options{Path: path, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	for range 2 {
		if _, err := fl.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := fl.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the deadline", err)
	}
	appendFrames(t, path, fs[2:])
	r, err := fl.Next(context.Background())
	if err != nil || r.Seq != 3 {
		t.Fatalf("got %v, %v", r, err)
	}
	if err := fl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := fl.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}

// TestEOSEndsLive follows a file that gets an end-of-stream frame.
func TestEOSEndsLive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "e.ss")
	fs := frames("e", 1, 5, 1, 10)
	writeFile(t, path, streamfile.Header{FileName: "e.ss", CreatedAtMs: 1, BeaconInterval: 1024}, fs)
	fl, err := New(Options{Path: path, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	collect(t, items, 5, 10*time.Second)
	appendFrames(t, path, []streamfile.Frame{{Key: streamfile.EOSKey, TimestampMs: 9, Payload: []byte(streamfile.EOSPayload)}})
	eos := collect(t, items, 1, 10*time.Second)[0]
	if !eos.IsEOS() {
		t.Fatalf("got %s, want the end of stream", eos)
	}
	select {
	case it := <-items:
		if !errors.Is(it.err, io.EOF) {
			t.Fatalf("got %v after the end of stream, want io.EOF", it)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no io.EOF after the end of stream")
	}
}

// TestNoAllocs checks that delivering a record allocates nothing.
func TestNoAllocs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.ss")
	fs := frames("alloc", 1, 20000, 1, 100)
	writeFile(t, path, streamfile.Header{FileName: "a.ss", CreatedAtMs: 1, BeaconInterval: streamfile.DefaultBeaconInterval}, fs)
	fl, err := New(Options{Path: path, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	ctx := context.Background()
	for range 1000 {
		if _, err := fl.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(10000, func() {
		if _, err := fl.Next(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0.01 {
		t.Fatalf("%.3f allocations per record", allocs)
	}
}

// TestSkipFormatErrorLive damages a frame near the end of a live file: the
// follower waits for the beacon it resynchronises at, and for the frame
// after it, then goes on.
func TestSkipFormatErrorLive(t *testing.T) {
	edgeA, _ := vectorFrames(t, "edge-a-spliced")
	for _, tc := range []struct {
		damage, cut int
		lost        int // index of the damaged frame
	}{
		{1126, 1200, 7}, // the damaged frame is incomplete
		{1126, 2060, 7}, // the beacon after it is incomplete
		{1126, 2100, 7}, // the frame after that beacon is incomplete
		{2088, 4200, 8}, // the frame after the beacon at 4096 starts past the end
	} {
		data := readVector(t, "edge-a-spliced")
		data[tc.damage] = '/'
		path := filepath.Join(t.TempDir(), "bad.ss")
		if err := os.WriteFile(path, data[:tc.cut], 0o644); err != nil {
			t.Fatal(err)
		}
		obs := newObserver()
		fl, err := New(Options{Path: path, PollInterval: time.Hour, Observer: obs, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		items, stop := follow(t, fl)
		want := append(edgeA[:tc.lost:tc.lost], edgeA[tc.lost+1:]...)
		gotten := collect(t, items, tc.lost, 10*time.Second)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, piece := range [][]byte{data[tc.cut : tc.cut+200], data[tc.cut+200:]} {
			time.Sleep(5 * time.Millisecond)
			if _, err := f.Write(piece); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		gotten = append(gotten, collect(t, items, len(want)-tc.lost, 10*time.Second)...)
		stop()
		fl.Close()
		if err := sameFrames(gotten, want); err != nil {
			t.Fatalf("damage at %d, cut at %d: %v", tc.damage, tc.cut, err)
		}
		if obs.count(EventFormat) != 1 || obs.count(EventTruncated) != 0 {
			t.Fatalf("damage at %d, cut at %d: observer: %v", tc.damage, tc.cut, obs)
		}
	}
}

// TestReadOn: after a replay's io.EOF at the end of the data, ReadOn lets
// Next read what was appended since, and ends again at the new end; after
// an end-of-stream frame it refuses.
func TestReadOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.ss")
	writeFile(t, path, streamfile.Header{FileName: "r.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 3, 1, 40))
	fl, err := New(Options{Path: path, Replay: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	read := func(want int) {
		t.Helper()
		for i := range want {
			if _, err := fl.Next(t.Context()); err != nil {
				t.Fatalf("record %d of %d: %v", i+1, want, err)
			}
		}
		if _, err := fl.Next(t.Context()); !errors.Is(err, io.EOF) {
			t.Fatalf("after %d records: %v, want io.EOF", want, err)
		}
	}
	read(3)
	if _, err := fl.Next(t.Context()); !errors.Is(err, io.EOF) {
		t.Fatalf("a replay's end without ReadOn: %v, want io.EOF again", err)
	}
	appendFrames(t, path, frames("k", 4, 2, 4, 40))
	if !fl.ReadOn() {
		t.Fatal("ReadOn refused at a replay's end")
	}
	read(2)
	if !fl.ReadOn() {
		t.Fatal("ReadOn refused at a replay's end with nothing appended")
	}
	read(0)
	appendFrames(t, path, []streamfile.Frame{{Key: "k", Seq: 6, TimestampMs: 6, Payload: []byte("x")}, {Key: streamfile.EOSKey, TimestampMs: 7, Payload: []byte(streamfile.EOSPayload)}})
	if !fl.ReadOn() {
		t.Fatal("ReadOn refused at a replay's end")
	}
	read(2) // the record and the end-of-stream frame
	if fl.ReadOn() {
		t.Fatal("ReadOn lifted the end of stream")
	}
}

// TestReplayWaitsForWriter: a replay that finds the data ending inside a
// frame while a writer holds the file's lock (in the middle of an append)
// waits, the wait counted as a stall, and reads the frame once the writer
// is done instead of failing on it; stopped while it waits, it says so.
func TestReplayWaitsForWriter(t *testing.T) {
	for _, writerFinishes := range []bool{true, false} {
		t.Run(fmt.Sprintf("writer finishes %v", writerFinishes), func(t *testing.T) {
			dir := t.TempDir()
			h := streamfile.Header{FileName: "w.ss", CreatedAtMs: 1, BeaconInterval: 1024}
			path, whole := filepath.Join(dir, "w.ss"), filepath.Join(dir, "whole.ss")
			writeFile(t, path, h, frames("k", 1, 3, 1, 10))
			writeFile(t, whole, h, frames("k", 1, 4, 1, 10))
			have, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			all, err := os.ReadFile(whole)
			if err != nil {
				t.Fatal(err)
			}
			last := all[len(have):] // the fourth frame
			w, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := durable.Lock(w.Fd(), durable.Exclusive); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(last[:len(last)/2]); err != nil {
				t.Fatal(err)
			}
			fl, err := New(Options{Path: path, Replay: true, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			collect(t, items, 3, 10*time.Second)
			waitFor(t, 10*time.Second, "the replay to wait for the writer, stalled", func() bool { return fl.Stalled() > 0 })
			if !writerFinishes {
				stop()
				if it := <-items; !errors.Is(it.err, context.Canceled) {
					t.Fatalf("stopped while waiting for the writer: %v, want context.Canceled", it.err)
				}
				return
			}
			if _, err := w.Write(last[len(last)/2:]); err != nil {
				t.Fatal(err)
			}
			if err := durable.Unlock(w.Fd()); err != nil {
				t.Fatal(err)
			}
			if r := collect(t, items, 1, 10*time.Second)[0]; r.Seq != 4 {
				t.Fatalf("after the append: %s, want the fourth record", r)
			}
			if it := <-items; !errors.Is(it.err, io.EOF) {
				t.Fatalf("after the fourth record: %v, want io.EOF", it.err)
			}
			if s := fl.Stalled(); s != 0 {
				t.Fatalf("Stalled() = %v after the wait, want 0", s)
			}
		})
	}
}
