package streamfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/streamd/streamd/internal/testutil"
)

// readFrames decodes every frame of the file at path and returns the frames
// and their offsets, failing on anything but a clean end.
func readFrames(t testing.TB, path string) ([]Frame, []int64) {
	t.Helper()
	frames, offsets, err := decodeFrames(t, path)
	if !errors.Is(err, io.EOF) && !errors.Is(err, ErrEndOfStream) {
		t.Fatalf("%s: %v", path, err)
	}
	return frames, offsets
}

// readFramesLenient reads frames up to a torn tail, returning the error
// that stopped it.
func readFramesLenient(t testing.TB, path string) ([]Frame, error) {
	frames, _, err := decodeFrames(t, path)
	return frames, err
}

// decodeFrames decodes the file at path until the first error, which it
// returns with the frames (payloads copied) and their offsets.
func decodeFrames(t testing.TB, path string) ([]Frame, []int64, error) {
	t.Helper()
	d := openDecoder(t, path)
	var frames []Frame
	var offsets []int64
	for {
		r, err := d.Next()
		if err != nil {
			return frames, offsets, err
		}
		fr := r.Frame
		fr.Payload = bytes.Clone(r.Payload)
		frames = append(frames, fr)
		offsets = append(offsets, r.Offset)
	}
}

// openDecoder returns a decoder of the file at path from its first frame;
// the test's cleanup closes the file.
func openDecoder(t testing.TB, path string) *Decoder {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	h, err := ReadHeader(f)
	if err != nil {
		t.Fatal(err)
	}
	return NewDecoder(f, h, HeaderSize)
}

// checkBeacons fails the test if Verify finds a problem in the file.
func checkBeacons(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if _, err := Verify(f, fi.Size()); err != nil {
		t.Fatal(err)
	}
}

func randomFrames(rng *rand.Rand, n int, keys []string) []Frame {
	frames := make([]Frame, n)
	for i := range frames {
		p := make([]byte, rng.IntN(300))
		for j := range p {
			p[j] = byte(rng.Uint32())
		}
		frames[i] = Frame{Key: keys[rng.IntN(len(keys))], TimestampMs: 1_700_000_000_000 + uint64(i), Payload: p}
	}
	return frames
}

// TestPublishInBatchesEqualsSingleRun checks that publishing in many batches
// produces exactly the bytes of one writer writing everything at once: the
// beacons, remaining counts, marker choice and running checksums of a single
// writer.
func TestPublishInBatchesEqualsSingleRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	keys := []string{"orders", "audit", "Zed", "orders.retry"}
	frames := randomFrames(rng, 2000, keys)
	hdr := Header{FileName: "batched.ss", CreatedAtMs: 1_700_000_000_000, BeaconInterval: 1024}
	dir := t.TempDir()

	batched := filepath.Join(dir, "batched.ss")
	w, err := OpenWriter(batched, CreateOptions{Header: hdr, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	for rest := frames; len(rest) > 0; {
		n := min(len(rest), 1+rng.IntN(50))
		if err := w.Publish(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	w.Close()

	// The same frames, with the sequences Publish assigned, in one Append.
	single := filepath.Join(dir, "single.ss")
	w, err = OpenWriter(single, CreateOptions{Header: hdr, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(frames...); err != nil {
		t.Fatal(err)
	}
	w.Close()

	a, _ := os.ReadFile(batched)
	b, _ := os.ReadFile(single)
	if !bytes.Equal(a, b) {
		t.Fatal("batched publish differs from a single writing run")
	}
	got, _ := readFrames(t, batched)
	next := map[string]uint64{}
	for i, f := range got {
		next[f.Key]++
		if f.Seq != next[f.Key] {
			t.Fatalf("frame %d (%s): seq %d, want %d", i, f.Key, f.Seq, next[f.Key])
		}
	}
	checkBeacons(t, batched)
}

// TestAppendContinuesFile reopens files (upstream-written ones included) and
// appends, checking that every earlier frame stays, sequences continue and
// beacons stay well placed.
func TestAppendContinuesFile(t *testing.T) {
	for _, name := range []string{"sample-1", "consumer", "quicksort", "edge-a-spliced", "edge-b-truncated", "edge-d-eos"} {
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name+".ss")
			if err := os.WriteFile(path, src, 0o644); err != nil {
				t.Fatal(err)
			}
			before, _ := readFramesLenient(t, path)
			rng := rand.New(rand.NewPCG(3, 4))
			added := randomFrames(rng, 300, []string{"hello", "file", "alpha", "new.key"})
			for round := 0; round < 3; round++ {
				w, err := OpenWriter(path, CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				part := added[round*100 : (round+1)*100]
				if err := w.Publish(part); err != nil {
					t.Fatal(err)
				}
				w.Close()
			}
			after, _ := readFrames(t, path)
			// Earlier frames (but a trailing end-of-stream) come first, unchanged.
			if n := len(before); n > 0 && before[n-1].IsEOS() {
				before = before[:n-1]
			}
			if err := sameFrames(after[:len(before)], before); err != nil {
				t.Fatalf("earlier frames changed: %v", err)
			}
			if err := sameFrames(after[len(before):], added); err != nil {
				t.Fatalf("appended frames: %v", err)
			}
			maxSeq := map[streamShard]uint64{}
			for _, f := range before {
				k := streamShard{f.Key, f.Shard}
				maxSeq[k] = max(maxSeq[k], f.Seq)
			}
			for _, f := range after[len(before):] {
				k := streamShard{f.Key, f.Shard}
				maxSeq[k]++
				if f.Seq != maxSeq[k] {
					t.Fatalf("%s/%d: seq %d, want %d", f.Key, f.Shard, f.Seq, maxSeq[k])
				}
			}
			checkBeacons(t, path)
		})
	}
}

// TestAppendAfterForeignWriter interleaves two writers on one file: each
// catches up with the other's frames before writing.
func TestAppendAfterForeignWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.ss")
	hdr := Header{FileName: "shared.ss", CreatedAtMs: 1, BeaconInterval: 1024}
	a, err := OpenWriter(path, CreateOptions{Header: hdr, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenWriter(path, CreateOptions{Header: hdr, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var want []Frame
	for i := range 400 {
		w := a
		if rng.IntN(2) == 0 {
			w = b
		}
		batch := randomFrames(rng, 1+rng.IntN(5), []string{"k", "j"})
		if err := w.Publish(batch); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		want = append(want, batch...)
	}
	a.Close()
	b.Close()
	got, _ := readFrames(t, path)
	if err := sameFrames(got, want); err != nil {
		t.Fatal(err)
	}
	checkBeacons(t, path)
}

func TestWriterRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, want string
		setup      func(path string)
		opts       CreateOptions
		frames     []Frame
	}{
		{name: "wrong magic", want: "not a stream file", setup: func(p string) { os.WriteFile(p, bytes.Repeat([]byte{'x'}, 200), 0o644) }},
		{name: "wrong version", want: "unsupported format version 2", setup: func(p string) {
			b, _ := AppendHeader(nil, &Header{FileName: "v", BeaconInterval: 1024})
			b[2] = 2
			os.WriteFile(p, b, 0o644)
		}},
		{name: "missing without create", want: "no such file"},
		{name: "long file name", want: "header file name is 112 bytes long", opts: CreateOptions{Create: true, Header: Header{FileName: strings.Repeat("n", 112), BeaconInterval: 1024}}},
		{name: "small interval", want: "beacon interval 64 is below the minimum", opts: CreateOptions{Create: true, Header: Header{BeaconInterval: 64}}},
		{name: "long key", want: "stream key is 250 bytes long", opts: CreateOptions{Create: true, Header: Header{BeaconInterval: 1024}},
			frames: []Frame{{Key: strings.Repeat("k", 250)}}},
		{name: "bad key char", want: `has character ' ' at byte 1`, opts: CreateOptions{Create: true, Header: Header{BeaconInterval: 1024}},
			frames: []Frame{{Key: "a b"}}},
		{name: "empty key", want: "stream key must be non-empty", opts: CreateOptions{Create: true, Header: Header{BeaconInterval: 1024}},
			frames: []Frame{{Key: ""}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprint(i))
			if tt.setup != nil {
				tt.setup(path)
			}
			before, _ := os.ReadFile(path)
			w, err := OpenWriter(path, tt.opts)
			if err == nil {
				err = w.Append(tt.frames...)
				w.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.want)
			}
			after, _ := os.ReadFile(path)
			if tt.frames != nil {
				// OpenWriter created the file with its header; only the frame must be missing.
				if len(after) != HeaderSize {
					t.Fatalf("file has %d bytes, want only the header", len(after))
				}
			} else if !bytes.Equal(before, after) {
				t.Fatal("file changed")
			}
		})
	}
}

// TestAppendRepairsTornTail appends to copies of edge-a cut at many points:
// the torn frame is replaced and the result decodes cleanly.
func TestAppendRepairsTornTail(t *testing.T) {
	full, err := os.ReadFile(filepath.Join(vectorDir, "edge-a-spliced.ss"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for cut := HeaderSize; cut <= len(full); cut += 37 {
		path := filepath.Join(dir, "torn.ss")
		os.WriteFile(path, full[:cut], 0o644)
		complete, _ := readFramesLenient(t, path)
		w, err := OpenWriter(path, CreateOptions{})
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		extra := []Frame{{Key: "alpha", TimestampMs: 1, Payload: []byte("after the cut")}}
		if err := w.Publish(extra); err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		w.Close()
		got, _ := readFrames(t, path)
		if err := sameFrames(got, append(complete, extra...)); err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		checkBeacons(t, path)
	}
}

// TestWriterRefuseReplaced: with RefuseReplaced a batch writes nothing and
// returns ErrReplaced once another file was renamed over the path, goes on
// appending when the file was renamed away and nothing took the path, and
// writes nothing and returns ErrRemoved when the file was deleted.
func TestWriterRefuseReplaced(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.ss")
	hdr := Header{FileName: "s.ss", BeaconInterval: 1024}
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: hdr, RefuseReplaced: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	frame := []Frame{{Key: "k", TimestampMs: 1, Payload: []byte("x")}}
	if err := w.Publish(frame); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(dir, "moved.ss")
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	if err := w.Publish(frame); err != nil {
		t.Fatalf("path gone: %v, want the append to go on", err)
	}
	other, err := OpenWriter(path, CreateOptions{Create: true, Header: hdr})
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	before, _ := os.Stat(moved)
	if err := w.Publish(frame); !errors.Is(err, ErrReplaced) {
		t.Fatalf("path replaced: %v, want ErrReplaced", err)
	}
	if after, _ := os.Stat(moved); after.Size() != before.Size() {
		t.Errorf("the refused batch wrote %d bytes", after.Size()-before.Size())
	}
	if frames, _ := readFrames(t, moved); len(frames) != 2 {
		t.Errorf("the old file has %d frames, want the 2 written before the replacement", len(frames))
	}

	// Deleted, with no file at the path: no reader would see the batch.
	d, err := OpenWriter(path, CreateOptions{Header: hdr, RefuseReplaced: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	size := d.Size()
	if err := d.Publish(frame); !errors.Is(err, ErrRemoved) {
		t.Fatalf("file deleted: %v, want ErrRemoved", err)
	}
	if d.Size() != size {
		t.Errorf("the refused batch wrote %d bytes", d.Size()-size)
	}
}

// TestPublishRefusesReservedKeys: a batch with a reserved key writes
// nothing, and names the key.
func TestPublishRefusesReservedKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "r.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, key := range []string{EOSKey, WildcardKey} {
		err := w.Publish([]Frame{{Key: "a", Payload: []byte("x")}, {Key: key, Payload: []byte(EOSPayload)}})
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Publish under %s: %v, want an error naming it", key, err)
		}
	}
	if fi, _ := os.Stat(path); fi.Size() != HeaderSize {
		t.Errorf("file is %d bytes, want the header only", fi.Size())
	}
}

// TestWriterStartsOverAfterTruncation: a file truncated under its writer
// (to nothing, into its header, or into its frames) is continued as it is
// now: a header first when it is shorter than one, the frames it still
// holds kept, sequences continued from them.
func TestWriterStartsOverAfterTruncation(t *testing.T) {
	for _, cut := range []int64{0, 50, HeaderSize, 0} {
		path := filepath.Join(t.TempDir(), "t.ss")
		w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "t.ss", BeaconInterval: 1024}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Publish([]Frame{{Key: "k", Payload: []byte("one")}, {Key: "k", Payload: []byte("two")}}); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, cut); err != nil {
			t.Fatal(err)
		}
		if err := w.Publish([]Frame{{Key: "k", Payload: []byte("three")}}); err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		w.Close()
		b, _ := os.ReadFile(path)
		h, entries := decodeAll(t, b)
		var got []string
		for _, e := range entries {
			if e.BeaconAt == nil {
				got = append(got, fmt.Sprintf("%d %s", e.Seq, e.PayloadB64))
			}
		}
		if h.FileName != "t.ss" || h.BeaconInterval != 1024 || !slices.Equal(got, []string{"1 dGhyZWU="}) {
			t.Errorf("cut at %d: header %+v, records %q; want the header kept and 1 three", cut, h, got)
		}
	}
}

// TestWriterRemovesLongZeroTail: zeros after the last frame that span
// several beacon intervals (where they pass for empty beacons) are removed
// to the last frame, and what is written after them is read.
func TestWriterRemovesLongZeroTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "z.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "z.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]Frame{{Key: "k", Payload: []byte("one")}}); err != nil {
		t.Fatal(err)
	}
	end := w.Size()
	w.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 5000))
	f.Close()
	if w, err = OpenWriter(path, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Publish([]Frame{{Key: "k", Payload: []byte("two")}}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	_, entries := decodeAll(t, b)
	var got []string
	for _, e := range entries {
		if e.BeaconAt == nil {
			got = append(got, fmt.Sprintf("%d %s %v", e.Seq, e.PayloadB64, e.Error))
		}
	}
	if want := []string{"1 b25l ", "2 dHdv "}; !slices.Equal(got, want) || int64(len(b)) > end+100 {
		t.Errorf("records %q in %d bytes, want %q right after the first (%d bytes)", got, len(b), want, end)
	}
}

// TestWritersSurviveTornAppends interleaves a long-lived writer (a producer)
// with writing runs that die in the middle of an append (a daemon killed
// with SIGKILL: a prefix of its batch on disk, or zeros in place of the
// batch's pages that did not reach the disk, as ext4 can leave them, after
// its first bytes or in place of all of it): every append after a crash
// succeeds, and the
// file holds every record of every completed append, in order.
func TestWritersSurviveTornAppends(t *testing.T) {
	t.Parallel()
	for seed := range uint64(32) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			path := filepath.Join(t.TempDir(), "s.ss")
			hdr := Header{FileName: "s.ss", BeaconInterval: 1024}
			producer, err := OpenWriter(path, CreateOptions{Create: true, Header: hdr})
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Close()
			var want []string
			n := 0
			batch := func(key string) []Frame {
				frames := make([]Frame, 1+rng.IntN(3))
				for i := range frames {
					n++
					frames[i] = Frame{Key: key, Payload: []byte(fmt.Sprintf("rs1:%0*d", 10+rng.IntN(200), n))}
				}
				return frames
			}
			payloads := func(frames []Frame) {
				for _, f := range frames {
					want = append(want, string(f.Payload))
				}
			}
			for step := range 120 {
				switch rng.IntN(3) {
				case 0:
					frames := batch("orders")
					if err := producer.Publish(frames); err != nil {
						t.Fatalf("step %d: producer: %v", step, err)
					}
					payloads(frames)
				default: // a daemon run: appends, then dies in the middle of one
					w, err := OpenWriter(path, CreateOptions{})
					if err != nil {
						t.Fatalf("step %d: open: %v", step, err)
					}
					for range rng.IntN(3) {
						frames := batch("orders")
						if err := w.Publish(frames); err != nil {
							t.Fatalf("step %d: daemon: %v", step, err)
						}
						payloads(frames)
					}
					before := w.Size()
					if err := w.Publish(batch("orders")); err != nil {
						t.Fatalf("step %d: daemon: %v", step, err)
					}
					if before < 0 { // its first append: it caught up before writing
						before = w.Size() - int64(len(w.buf))
					}
					torn := before + 1 + rng.Int64N(w.Size()-before-1)
					w.Close()
					page := int64(os.Getpagesize())
					written := before // what reached the disk; zeros from there to torn
					switch p := (before/page + 1) * page; rng.IntN(4) {
					case 0: // none of the batch
					case 1: // its pages before a page boundary inside the batch
						if p < torn {
							written = p
						}
					default:
						written = torn
					}
					if err := errors.Join(os.Truncate(path, written), os.Truncate(path, torn)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := producer.Publish(batch("orders")); err != nil {
				t.Fatalf("last append: %v", err)
			}
			frames, err := readFramesLenient(t, path)
			if !errors.Is(err, io.EOF) {
				t.Fatalf("reading the file: %v", err)
			}
			// Complete frames of a torn batch stay: the file holds every
			// completed append's record and maybe some of torn ones, each
			// once, in the order they were written.
			last, missing := -1, want
			for _, f := range frames {
				var k int
				if _, err := fmt.Sscanf(strings.TrimLeft(string(f.Payload[4:]), "0"), "%d", &k); err != nil || k <= last {
					t.Fatalf("record %q after record %d", f.Payload, last)
				}
				last = k
				if len(missing) > 0 && missing[0] == string(f.Payload) {
					missing = missing[1:]
				}
			}
			if len(missing) > 0 {
				t.Fatalf("%d records of completed appends are missing, the first %q", len(missing), missing[0])
			}
		})
	}
}

// TestWriterKeepsBeaconAfterLastFrame: when the last frame ends on a
// boundary, its beacon follows it; a new writing run appends after that
// beacon instead of writing it anew, so that a writer that knows the file's
// end (a producer that wrote the beacon) still finds a frame there.
func TestWriterKeepsBeaconAfterLastFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	producer, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	publish := func(w *Writer, payload string) {
		t.Helper()
		if err := w.Publish([]Frame{{Key: "k", Payload: []byte(payload)}}); err != nil {
			t.Fatal(err)
		}
	}
	publish(producer, strings.Repeat("a", 1100)) // a beacon at 1024 interrupts it
	// The next frame ends on the boundary at 2048: its beacon follows,
	// with the running checksum of k.
	publish(producer, strings.Repeat("b", int(2048-producer.Size())-len("k")-frameOverhead))
	if producer.Size() <= 2048+7 {
		t.Fatalf("the producer ends at %d, want past a beacon at 2048 that is not empty", producer.Size())
	}
	run, err := OpenWriter(path, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	publish(run, "c")
	run.Close()
	publish(producer, "d")
	frames, _ := readFrames(t, path)
	var got []string
	for _, f := range frames {
		got = append(got, string(f.Payload[:1]))
	}
	if !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("the file holds %q, want a b c d", got)
	}
}

// TestWriterFullDiskAtBoundary: the disk fills up exactly at a beacon
// boundary (RLIMIT_FSIZE makes every write at or past it fail without
// writing, as a full disk does on a block not yet allocated). The batch
// whose frame ends there succeeds without its beacon; the next one fails;
// once there is room again, the beacon is written at the boundary before
// the next frame, and the file reads to its end, each frame once. Not
// parallel: the limit holds for the process.
func TestWriterFullDiskAtBoundary(t *testing.T) {
	if !testutil.InOwnProcess(t) {
		return
	}
	path := filepath.Join(t.TempDir(), "full.ss")
	h := Header{FileName: "full.ss", CreatedAtMs: 1, BeaconInterval: 1024}
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: h})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	lift := testutil.LimitFileSize(t, 1024)
	// 1 + 1 + 28 + 863 + 3 = 896 bytes from 128: the frame ends at 1024,
	// and its beacon there does not fit. The frame is whole: the batch
	// succeeds (an error would have it written again).
	if err := w.Append(Frame{Key: "k", Seq: 1, TimestampMs: 1, Payload: make([]byte, 863)}); err != nil {
		t.Errorf("the batch whose frame filled the disk to the boundary: %v, want nil", err)
	}
	if err := w.Append(Frame{Key: "k", Seq: 2, TimestampMs: 2, Payload: []byte("x")}); err == nil {
		t.Error("a batch while the disk is full succeeded")
	}
	lift()
	if err := w.Append(Frame{Key: "k", Seq: 3, TimestampMs: 3, Payload: []byte("after")}); err != nil {
		t.Fatalf("once there is room: %v", err)
	}
	frames, _ := readFrames(t, path)
	if len(frames) != 2 || frames[0].Seq != 1 || frames[1].Seq != 3 {
		t.Errorf("the file holds %+v, want the frames of seq 1 and 3", frames)
	}
	b := make([]byte, 1)
	if _, err := w.f.ReadAt(b, 1024); err != nil || b[0] != trailer {
		t.Errorf("byte at the boundary: %x, %v; want a beacon's first byte", b, err)
	}
}

// TestWriterRefusesTimestampsPastYear9999: a frame readers would refuse
// (this writer's own scan among them) is not written: the file would be
// damaged from it on.
func TestWriterRefusesTimestampsPastYear9999(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ts.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "ts.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	err = w.Append(Frame{Key: "k", Seq: 1, TimestampMs: maxTimestampMs + 1, Payload: []byte("x")})
	if err == nil || !strings.Contains(err.Error(), "after year 9999") {
		t.Errorf("Append past year 9999: %v, want it refused", err)
	}
	if w.Size() > HeaderSize {
		t.Errorf("the writer wrote %d bytes, want none", w.Size()-HeaderSize)
	}
}

// TestOpenWriterNoDirectory: creating a file in a directory that does not
// exist says so, and that the directory is the caller's to create.
func TestOpenWriterNoDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	_, err := OpenWriter(filepath.Join(dir, "x.ss"), CreateOptions{Create: true, Header: Header{FileName: "x", BeaconInterval: DefaultBeaconInterval}})
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "directory "+dir+" does not exist") {
		t.Fatalf("OpenWriter: %v, want the missing directory named", err)
	}
}

// TestWriterTruncatedUnderBatch: a truncation (logrotate's copytruncate,
// which takes no lock) between a batch's look at the file and its write
// would leave the batch after a hole where the header was, and every later
// batch failing; the batch is written again after a new header, and the
// file reads back whole.
func TestWriterTruncatedUnderBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	var logs testutil.SyncBuffer
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: 1024},
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Publish([]Frame{{Key: "k", Payload: []byte("before")}}); err != nil {
		t.Fatal(err)
	}
	truncations := 1
	testBeforeWrite = func(f *os.File) {
		if truncations > 0 {
			truncations--
			f.Truncate(0)
		}
	}
	defer func() { testBeforeWrite = nil }()
	if err := w.Publish([]Frame{{Key: "k", Payload: []byte("raced")}}); err != nil {
		t.Fatalf("the batch that raced the truncation: %v", err)
	}
	if err := w.Publish([]Frame{{Key: "k", Payload: []byte("after")}}); err != nil {
		t.Fatalf("the batch after it: %v", err)
	}
	frames, _ := readFrames(t, path)
	var got []string
	for _, f := range frames {
		got = append(got, string(f.Payload))
	}
	if want := []string{"raced", "after"}; !slices.Equal(got, want) {
		t.Errorf("the file holds %q, want %q", got, want)
	}
	if !strings.Contains(logs.String(), "truncated while a batch was written") {
		t.Errorf("the log does not say the batch was written again:\n%s", logs.String())
	}
}

// TestWriterHeaderHole: a file that begins with a hole where its header
// was (left by a streamd that did not catch the race above) is started
// over, by a writer that opens it and by one that finds it so, instead of
// failing every batch for good.
func TestWriterHeaderHole(t *testing.T) {
	hdr := Header{FileName: "s.ss", BeaconInterval: 1024}
	for _, open := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "s.ss")
		w, err := OpenWriter(path, CreateOptions{Create: true, Header: hdr})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Publish([]Frame{{Key: "k", Payload: []byte("lost")}}); err != nil {
			t.Fatal(err)
		}
		f, _ := os.OpenFile(path, os.O_WRONLY, 0)
		f.WriteAt(make([]byte, HeaderSize), 0) // the hole
		f.Close()
		if open {
			w.Close()
			if w, err = OpenWriter(path, CreateOptions{Create: true, Header: hdr}); err != nil {
				t.Fatalf("open a file with a hole for a header: %v", err)
			}
		}
		if err := w.Publish([]Frame{{Key: "k", Payload: []byte("next")}}); err != nil {
			t.Fatalf("open %v: the batch after the hole: %v", open, err)
		}
		w.Close()
		if frames, _ := readFrames(t, path); len(frames) != 1 || string(frames[0].Payload) != "next" {
			t.Errorf("open %v: the file holds %v, want the batch after the hole alone", open, frames)
		}
	}
}

// TestAppendRefusesDamagedSize: a frame whose size field was damaged to run
// past the end of the file reads like a torn tail, but the frames after it
// are whole. A writer must refuse the file, as for other damage, and not
// cut them off as it would a torn frame; decode says where the damage is.
func TestAppendRefusesDamagedSize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	var frames []Frame
	for i := range 30 {
		frames = append(frames, Frame{Key: "orders", TimestampMs: 1, Payload: []byte(strings.Repeat(string(rune('a'+i%26)), 20+i*7))})
	}
	if err := w.Publish(frames); err != nil {
		t.Fatal(err)
	}
	w.Close()
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, offsets := readFrames(t, path)
	refused := 0
	for i, off := range offsets[:len(offsets)-1] {
		// The size field, 1+6+24 bytes into the frame, unless a beacon
		// cuts the frame before it: past the end of the file.
		at := off + 31
		if off/1024 != (at+4)/1024 {
			continue
		}
		damaged := slices.Clone(whole)
		binary.BigEndian.PutUint32(damaged[at:], uint32(len(whole)))
		os.WriteFile(path, damaged, 0o644)
		w, err := OpenWriter(path, CreateOptions{})
		if err == nil {
			err = w.Publish(frames[:1])
			w.Close()
		}
		var de *DamageError
		if !errors.As(err, &de) || de.Offset != off {
			t.Fatalf("frame %d at %d: append = %v, want a DamageError at %d", i, off, err, off)
		}
		if got, _ := os.ReadFile(path); !bytes.Equal(got, damaged) {
			t.Fatalf("frame %d at %d: the refused append changed the file from %d to %d bytes", i, off, len(damaged), len(got))
		}
		f, _ := os.Open(path)
		h, size, _, err := Identify(f)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		_, err = FormatLog.Print(&out, f, &h, size)
		f.Close()
		var fe *FormatError
		if !errors.As(err, &fe) || fe.Offset != off || !strings.Contains(out.String(), "a damaged frame, not a torn one") {
			t.Fatalf("frame %d at %d: decode = %v, want a format error there; printed:\n%s", i, off, err, out.String())
		}
		refused++
	}
	if refused < 20 {
		t.Fatalf("only %d frames checked", refused)
	}
}

// TestOpenWriterNotRegular: a path that names a named pipe or a device is
// refused, with what it is, before anything is written to it.
func TestOpenWriterNotRegular(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo.ss")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, os.DevNull} {
		w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: 1024}})
		if err == nil {
			w.Close()
		}
		if err == nil || !strings.Contains(err.Error(), path+" is not a regular file") {
			t.Errorf("OpenWriter(%s): %v, want it refused as not a regular file", path, err)
		}
	}
}

// TestWriterLetsGoOfALargeBatch: a batch larger than writerKeep is encoded
// into memory sized for it at once (about its size, not twice that grown
// by doubling), which the writer lets go of once the batch is written, so
// that a writer kept open does not hold the largest batch it wrote.
func TestWriterLetsGoOfALargeBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: DefaultBeaconInterval}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Append(Frame{Key: "k", Seq: 1, Payload: []byte("small")}); err != nil {
		t.Fatal(err)
	}
	const size = 6 << 20
	big := largePayload(size, 5)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	err = w.Append(Frame{Key: "k", Seq: 2, Payload: big})
	runtime.ReadMemStats(&ms1)
	if err != nil {
		t.Fatal(err)
	}
	if a := ms1.TotalAlloc - ms0.TotalAlloc; a > size+size/4 {
		t.Errorf("appending a frame of %d bytes allocated %d bytes, want about the frame", size, a)
	}
	if cap(w.buf) > writerKeep {
		t.Errorf("after the batch, the writer keeps %d bytes of it, want at most %d", cap(w.buf), writerKeep)
	}
	if err := w.Append(Frame{Key: "k", Seq: 3, Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	frames, _ := readFrames(t, path)
	if len(frames) != 3 || !bytes.Equal(frames[1].Payload, big) || string(frames[2].Payload) != "after" {
		t.Errorf("read %d frames back, want the three appended", len(frames))
	}
}

// TestAppendSaysTornTail: an append that removes a torn frame another
// writer left at the end of the file says so at WARN, with where it was
// and how long; one that finds the file whole says nothing.
func TestAppendSaysTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	publish := func(payload string) {
		t.Helper()
		w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: 1024}, Log: logger})
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(w.Publish([]Frame{{Key: "k", TimestampMs: 1, Payload: []byte(payload)}}), w.Close()); err != nil {
			t.Fatal(err)
		}
	}
	publish("a")
	whole, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	publish(strings.Repeat("b", 50))
	if err := os.Truncate(path, whole.Size()+20); err != nil { // b's writer stopped in the middle
		t.Fatal(err)
	}
	publish("c")
	want := fmt.Sprintf("level=WARN msg=\"removed an incomplete record at the end of the file, which a writer left when it stopped in the middle of an append (a torn tail): that record is lost\" file=%s offset=%d bytes=20\n", path, whole.Size())
	if _, line, _ := strings.Cut(log.String(), " "); line != want { // after the time
		t.Fatalf("log %q, want %q", log.String(), want)
	}
	log.Reset()
	publish("d")
	if log.Len() != 0 {
		t.Fatalf("an append to a whole file logged %q", log.String())
	}
	if got, _ := readFrames(t, path); len(got) != 3 || string(got[1].Payload) != "c" {
		t.Fatalf("the file holds %d frames, want a, c and d", len(got))
	}
}
