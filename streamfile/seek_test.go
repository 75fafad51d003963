package streamfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
)

// countingReader counts ReadAt calls and the bytes they ask for.
type countingReader struct {
	r     io.ReaderAt
	reads atomic.Int64
	bytes atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	c.bytes.Add(int64(len(p)))
	return c.r.ReadAt(p, off)
}

// writeSeekFile writes n frames over keys, with timestamps growing by 1 ms,
// and returns the path and the frames as written.
func writeSeekFile(t testing.TB, interval uint32, n, payload int, keys []string) (string, []Frame) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "seek.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "seek.ss", BeaconInterval: interval}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	var all []Frame
	batch := make([]Frame, 0, 512)
	for i := range n {
		batch = append(batch, Frame{Key: keys[rng.IntN(len(keys))], TimestampMs: 1_000_000 + uint64(i), Payload: make([]byte, payload)})
		if len(batch) == cap(batch) || i == n-1 {
			if err := w.Publish(batch); err != nil {
				t.Fatal(err)
			}
			all = append(all, batch...)
			batch = batch[:0]
		}
	}
	return path, all
}

func TestSeekMatchesScan(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval uint32
		keys     []string
	}{
		{"one marker per beacon", 1024, []string{"a", "b", "c", "d", "e"}},
		{"all keys in every beacon", 8192, []string{"a", "b", "c"}},
		{"rare key", 1024, []string{"a", "a", "a", "a", "a", "a", "a", "a", "rare"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, frames := writeSeekFile(t, tc.interval, 5000, 40, tc.keys)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			h, _ := ReadHeader(f)
			_, offsets := readFrames(t, path)
			rng := rand.New(rand.NewPCG(1, 1))
			for range 200 {
				key := tc.keys[rng.IntN(len(tc.keys))]
				tg := Target{Key: key}
				if rng.IntN(2) == 0 {
					tg.BySeq, tg.Seq = true, uint64(rng.IntN(2000))
				} else {
					tg.AfterMs = 1_000_000 + uint64(rng.IntN(5100)) - 50
				}
				want := int64(-1)
				for i, fr := range frames {
					if fr.Key == key && tg.right(fr.Seq, fr.TimestampMs) {
						want = offsets[i]
						break
					}
				}
				got, err := Seek(f, h, fi.Size(), tg)
				if want < 0 {
					if !errors.Is(err, ErrNotFound) {
						t.Fatalf("%+v: got %d, %v; want ErrNotFound", tg, got, err)
					}
					continue
				}
				if err != nil || got != want {
					t.Fatalf("%+v: got %d, %v; want %d", tg, got, err, want)
				}
			}
		})
	}
}

// TestSeekReadsLogarithmic seeks in a file of 4096 beacon intervals and
// counts the reads: a bisection, not a scan.
func TestSeekReadsLogarithmic(t *testing.T) {
	const interval = 16 << 10
	n := 4096 * interval / (1024 + 40)
	if testing.Short() {
		n /= 8
	}
	path, frames := writeSeekFile(t, interval, n, 1024, []string{"orders", "audit"})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	h, _ := ReadHeader(f)
	last := frames[len(frames)-1]
	for _, tg := range []Target{
		{Key: "orders", BySeq: true, Seq: 1},
		{Key: "orders", BySeq: true, Seq: uint64(n / 3)},
		{Key: "audit", AfterMs: last.TimestampMs - 10},
		{Key: last.Key, BySeq: true, Seq: last.Seq},
	} {
		cr := &countingReader{r: f}
		if _, err := Seek(cr, h, fi.Size(), tg); err != nil {
			t.Fatalf("%+v: %v", tg, err)
		}
		blocks := cr.bytes.Load() / interval
		if cr.reads.Load() > 64 || blocks > 64 {
			t.Errorf("%+v: %d reads of %d bytes (%d beacon-sized blocks), want at most 64", tg, cr.reads.Load(), cr.bytes.Load(), blocks)
		}
	}
}

func TestEndAndBoundary(t *testing.T) {
	full, err := os.ReadFile(filepath.Join(vectorDir, "edge-a-spliced.ss"))
	if err != nil {
		t.Fatal(err)
	}
	exp := loadExpected(t, "edge-a-spliced")
	h := exp.header
	var starts []int64
	for _, e := range exp.entries {
		if e.BeaconAt == nil {
			starts = append(starts, e.Offset)
		}
	}
	// End at every cut: the start of the first frame not complete before it.
	for cut := int64(HeaderSize); cut <= int64(len(full)); cut++ {
		r := &sliceReader{full[:cut]}
		got, err := End(r, h, cut)
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		d := NewDecoder(r, h, HeaderSize)
		for {
			if _, err := d.Next(); err != nil {
				break
			}
		}
		if got != d.Pos() {
			t.Fatalf("cut %d: End = %d, sequential reader stops at %d", cut, got, d.Pos())
		}
	}
	// FrameBoundaryAfter at every offset: the first frame start at or after a boundary.
	for off := int64(HeaderSize + 1); off < int64(len(full)); off += 5 {
		got, err := FrameBoundaryAfter(&sliceReader{full}, h, off)
		b := (off + 1023) / 1024 * 1024
		if b >= int64(len(full)) {
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("offset %d: no beacon follows, got %d, %v; want ErrTruncated", off, got, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		want := int64(len(full))
		for _, s := range starts {
			if s > b {
				want = s
				break
			}
		}
		if got != want {
			t.Fatalf("offset %d: FrameBoundaryAfter = %d, want %d", off, got, want)
		}
	}
}

// sliceReader is a bytes.Reader limited to ReadAt.
type sliceReader struct{ b []byte }

func (s *sliceReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(s.b)) {
		return 0, io.EOF
	}
	n := copy(p, s.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// TestEndBeforeCrashLeftovers: End stops where a crash's zeros begin after
// the last frame, where the next writer appends, whether the zeros reach a
// beacon boundary or not.
func TestEndBeforeCrashLeftovers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "z.ss")
	h := Header{FileName: "z.ss", BeaconInterval: 1024}
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: h})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]Frame{{Key: "k", Payload: []byte("one")}, {Key: "k", Payload: []byte("two")}}); err != nil {
		t.Fatal(err)
	}
	last := w.Size()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{last + 100, 4096} {
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := End(f, h, size)
		f.Close()
		if err != nil || got != last {
			t.Errorf("zeros to %d: End = %d, %v; want %d, where the zeros begin", size, got, err, last)
		}
	}
}

// TestDamagedBeaconRemaining: beacons carry no checksum. With the count of
// what remains of the frame a beacon interrupts damaged (larger than the
// interval, off by one, one frame too far, zero), a seek still finds the
// first frame at or past its target, End still finds the end, and a writer
// still appends after the last frame: none of them skips frames or stops
// at the damage, which sequential readers do not see.
func TestDamagedBeaconRemaining(t *testing.T) {
	// Frames shorter than the interval, and frames that span beacons, whose
	// later beacons must count what the first one did.
	for _, tc := range []struct{ n, payload int }{{400, 70}, {60, 2500}} {
		t.Run(fmt.Sprintf("payload %d", tc.payload), func(t *testing.T) {
			path, frames := writeSeekFile(t, 1024, tc.n, tc.payload, []string{"a", "b"})
			intact, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			h, _ := ReadHeader(&sliceReader{intact})
			_, offsets := readFrames(t, path)
			frameAfter := func(off int64) int64 { // the start of the first frame after off, or the end
				if i, _ := slices.BinarySearch(offsets, off+1); i < len(offsets) {
					return offsets[i]
				}
				return int64(len(intact))
			}
			var targets []Target
			for i, fr := range frames {
				if i%7 == 0 {
					targets = append(targets, Target{Key: fr.Key, BySeq: true, Seq: fr.Seq}, Target{Key: fr.Key, AfterMs: fr.TimestampMs - 1})
				}
			}
			want := func(tg Target) int64 {
				for i, fr := range frames {
					if fr.Key == tg.Key && tg.right(fr.Seq, fr.TimestampMs) {
						return offsets[i]
					}
				}
				return -1
			}
			for b := int64(1024); b < int64(len(intact))-1024; b += 1024 {
				remaining := int64(binary.BigEndian.Uint32(intact[b+1:]))
				first := frameAfter(b)                              // where the beacon leads
				oneFrameOn := remaining + frameAfter(first) - first // to the frame after that one: a skip, not garbage
				for _, damaged := range []int64{remaining + 1<<20, remaining + 1, remaining - 1, oneFrameOn, 0} {
					if damaged == remaining || damaged < 0 {
						continue
					}
					t.Run(fmt.Sprintf("beacon %d remaining %d for %d", b, damaged, remaining), func(t *testing.T) {
						data := slices.Clone(intact)
						binary.BigEndian.PutUint32(data[b+1:], uint32(damaged))
						r := &sliceReader{data}
						for _, tg := range targets {
							if got, err := Seek(r, h, int64(len(data)), tg); err != nil || got != want(tg) {
								t.Fatalf("Seek %+v = %d, %v; want %d", tg, got, err, want(tg))
							}
						}
						if end, err := End(r, h, int64(len(data))); err != nil || end != int64(len(data)) {
							t.Fatalf("End = %d, %v; want %d", end, err, len(data))
						}
						damagedPath := filepath.Join(t.TempDir(), "damaged.ss")
						os.WriteFile(damagedPath, data, 0o644)
						w, err := OpenWriter(damagedPath, CreateOptions{})
						if err != nil {
							t.Fatal(err)
						}
						err = w.Append(Frame{Key: "a", Seq: 1 << 20, TimestampMs: 1, Payload: []byte("after")})
						w.Close()
						if err != nil {
							t.Fatalf("Append: %v", err)
						}
						if got, _ := readFrames(t, damagedPath); len(got) != len(frames)+1 || string(got[len(frames)].Payload) != "after" {
							t.Fatalf("after the append the file holds %d frames, want the %d before it and the new one", len(got), len(frames))
						}
					})
				}
			}
		})
	}
}

// TestCheckedBoundaryVectors: the beacons of the upstream writer's files
// pass the checks a seek makes of them (CheckedBoundary), and lead where
// FrameBoundaryAfter, which trusts them, does: the checks take no valid
// beacon for a damaged one.
func TestCheckedBoundaryVectors(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
			if err != nil {
				t.Fatal(err)
			}
			r := &sliceReader{b}
			h, err := ReadHeader(r)
			if err != nil {
				t.Fatal(err)
			}
			interval := int64(h.BeaconInterval)
			for at := interval; at < int64(len(b)); at += interval {
				want, werr := FrameBoundaryAfter(r, h, at)
				got, err := CheckedBoundary(r, h, at)
				if werr == nil && (err != nil || got != want) {
					t.Errorf("beacon at %d: CheckedBoundary = %d, %v; FrameBoundaryAfter = %d", at, got, err, want)
				}
			}
		})
	}
}

// TestFrameDamageBeforeBeacon: damaged frames before a beacon say nothing of
// the beacon: a seek past them starts at the beacon after them, or reads on
// past them as a follower does, and End reads from the last beacon, not the
// whole file.
func TestFrameDamageBeforeBeacon(t *testing.T) {
	path, frames := writeSeekFile(t, 1024, 2000, 70, []string{"a"})
	_, offsets := readFrames(t, path)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := ReadHeader(&sliceReader{data})
	damaged := slices.IndexFunc(offsets, func(o int64) bool { return o > 3072+64 }) // a frame in [3072, 4096)
	data[offsets[damaged]+1] = '!'                                                  // its key
	r := &sliceReader{data}
	for i := damaged + 1; i < len(frames); i += 97 {
		if offsets[i] < 4096+1024 {
			continue // read from a beacon before the damage, a seek meets it
		}
		got, err := Seek(r, h, int64(len(data)), Target{Key: "a", BySeq: true, Seq: frames[i].Seq})
		if err != nil || got != offsets[i] {
			t.Errorf("Seek seq %d = %d, %v; want %d", frames[i].Seq, got, err, offsets[i])
		}
	}
	cr := &countingReader{r: r}
	if end, err := End(cr, h, int64(len(data))); err != nil || end != int64(len(data)) {
		t.Errorf("End = %d, %v; want %d", end, err, len(data))
	}
	if n := cr.bytes.Load(); n > 8*1024 {
		t.Errorf("End read %d bytes, want the last intervals only", n)
	}
	// Damage in the last interval, after the beacon End starts at: the end
	// past it, where a reader that skips it reads on, not a read of the
	// whole file for a damaged beacon; while nothing follows it, before it.
	last := offsets[len(offsets)-3]
	data[last+1] = '!'
	cr = &countingReader{r: r}
	if end, err := End(cr, h, int64(len(data))); err != nil || end != int64(len(data)) {
		t.Errorf("End with damage at %d = %d, %v; want %d", last, end, err, len(data))
	}
	if n := cr.bytes.Load(); n > 8*1024 {
		t.Errorf("End read %d bytes, want the last intervals only", n)
	}
	if end, err := End(r, h, offsets[len(offsets)-2]); err != nil || end != last {
		t.Errorf("End with damage at %d and nothing after = %d, %v; want %d", last, end, err, last)
	}
	for i := damaged + 1; i < len(frames); i++ { // a seek meets the damage and reads on past it
		if offsets[i] > 4096+1024 {
			break
		}
		if got, err := Seek(r, h, int64(len(data)), Target{Key: "a", BySeq: true, Seq: frames[i].Seq}); err != nil || got != offsets[i] {
			t.Errorf("Seek seq %d = %d, %v; want %d", frames[i].Seq, got, err, offsets[i])
		}
	}
}

// TestDamagedBeaconTornTail: a beacon whose count is off by a little, in a
// file whose last frame after it is torn (being written): End still finds
// where the readable frames end, as a sequential read does, and a seek
// through a beacon still being written reports no frame rather than fails.
func TestDamagedBeaconTornTail(t *testing.T) {
	path, _ := writeSeekFile(t, 1024, 80, 70, []string{"a", "b"})
	intact, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := ReadHeader(&sliceReader{intact})
	_, offsets := readFrames(t, path)
	for b := int64(1024); b < int64(len(intact)); b += 1024 {
		remaining := int64(binary.BigEndian.Uint32(intact[b+1:]))
		i, _ := slices.BinarySearch(offsets, b+1)
		if remaining == 0 || i+1 >= len(offsets) {
			continue
		}
		for _, cut := range []int64{offsets[i] + 3, offsets[i] + 20} {
			for _, damaged := range []int64{remaining - 1, remaining + 1, remaining + 5} {
				data := slices.Clone(intact[:cut])
				binary.BigEndian.PutUint32(data[b+1:], uint32(damaged))
				r := &sliceReader{data}
				d := NewDecoder(r, h, HeaderSize)
				for {
					if _, err := d.Next(); err != nil {
						break
					}
				}
				if got, err := End(r, h, cut); err != nil || got != d.Pos() {
					t.Errorf("beacon %d remaining %d for %d, cut at %d: End = %d, %v; want %d", b, damaged, remaining, cut, got, err, d.Pos())
				}
			}
		}
	}
	// A cut inside the beacon at 2048 of a file whose frame spans it.
	path, _ = writeSeekFile(t, 1024, 3, 2500, []string{"a"})
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, _ = ReadHeader(&sliceReader{full})
	for _, cut := range []int64{2049, 2053} {
		if _, err := Seek(&sliceReader{full[:cut]}, h, cut, Target{Key: "a", BySeq: true, Seq: 100}); !errors.Is(err, ErrNotFound) {
			t.Errorf("cut %d: Seek: %v, want ErrNotFound", cut, err)
		}
	}
}
