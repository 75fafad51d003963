package streamfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"
)

// readSizes are the read sizes the decoder tests run with: odd small reads
// that exercise the buffer edges, and the default, which takes a small file
// in one read.
var readSizes = []int{97, 0}

// newTestDecoder returns a decoder of file, whose header is h, from its
// first frame, reading readSize bytes at a time (0: the default).
func newTestDecoder(file []byte, h Header, readSize int) *Decoder {
	d := NewDecoder(bytes.NewReader(file), h, HeaderSize)
	d.ReadSize = readSize
	return d
}

// TestSkipDamagePastTheEnd: a skip that finds no frame (the file ends
// before the next boundary) leaves the decoder at the bad frame, which the
// next call reports again, whatever the read size.
func TestSkipDamagePastTheEnd(t *testing.T) {
	file, err := AppendHeader(nil, &Header{FileName: "bad.ss", BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	file = append(append(file, 0xFF), bytes.Repeat([]byte{1}, 300)...) // a key of 255 bytes: no frame
	for _, size := range readSizes {
		t.Run(fmt.Sprintf("readsize=%d", size), func(t *testing.T) {
			h, _ := ReadHeader(bytes.NewReader(file))
			d := newTestDecoder(file, h, size)
			var fe *FormatError
			if _, err := d.Next(); !errors.As(err, &fe) {
				t.Fatalf("Next = %v, want a format error", err)
			}
			if ok, err := d.SkipDamage(fe, int64(len(file))); ok || err != nil {
				t.Fatalf("SkipDamage = %v, %v; want no frame to go on at", ok, err)
			}
			if _, err := d.Next(); !errors.As(err, &fe) || fe.Offset != HeaderSize {
				t.Fatalf("Next after the failed skip = %v, want the format error at %d again", err, HeaderSize)
			}
		})
	}
}

// TestBeaconFillingTheInterval: a beacon must end before the next boundary
// (spec §6.1). One that reaches it would hide the beacon there, so that a
// decoder started at that boundary reads other frames than one that came
// through; it is a format error, whatever the read size.
func TestBeaconFillingTheInterval(t *testing.T) {
	file, err := AppendHeader(nil, &Header{FileName: "full.ss", BeaconInterval: 128})
	if err != nil {
		t.Fatal(err)
	}
	// At 128, a beacon of 128 bytes: 6, one marker of a 94-byte key (121), the end marker.
	file = append(file, trailer, 0, 0, 0, 0, 1, 94)
	file = append(file, bytes.Repeat([]byte{'a'}, 94)...)
	file = append(file, make([]byte, 26)...)
	file = append(file, trailer)
	if len(file) != 256 {
		t.Fatalf("crafted %d bytes, want 256", len(file))
	}
	file = append(file, trailer, 0, 0, 0, 0, 0, trailer) // the beacon at 256
	for _, size := range readSizes {
		h, _ := ReadHeader(bytes.NewReader(file))
		d := newTestDecoder(file, h, size)
		var fe *FormatError
		if _, err := d.Next(); !errors.As(err, &fe) || fe.Offset != 128 {
			t.Errorf("read size %d: Next = %v, want a format error at 128", size, err)
		}
	}
}

// TestTornFrameOrDamage: a file that ends inside a frame is a torn frame
// (ErrTruncated: a writer may still be writing it) only while the bytes
// that are there could begin a frame; a key that is already wrong is
// damage at once, a format error, whatever the read size.
func TestTornFrameOrDamage(t *testing.T) {
	file := writtenFile(t, 1024, []Frame{{Key: "first", Payload: []byte("one")}, {Key: "orders", Payload: []byte("two")}})
	second := HeaderSize + 1 + len("first") + 28 + len("one") + 3 // the offset of the second frame
	tests := []struct {
		name   string
		tail   []byte // after the first frame
		damage bool
	}{
		{"cut inside the key", file[second : second+4], false},
		{"cut inside the fields", file[second : second+1+len("orders")+10], false},
		{"cut inside the payload", file[second : len(file)-4], false},
		{"a wrong key, then too few bytes for the fields", []byte("\x05ab cd\x00\x00garbage here!!!"), true},
	}
	for _, tt := range tests {
		for _, size := range readSizes {
			t.Run(fmt.Sprintf("%s/readsize=%d", tt.name, size), func(t *testing.T) {
				f := append(slices.Clip(file[:second]), tt.tail...)
				h, _ := ReadHeader(bytes.NewReader(f))
				d := newTestDecoder(f, h, size)
				if _, err := d.Next(); err != nil {
					t.Fatalf("first frame: %v", err)
				}
				_, err := d.Next()
				var fe *FormatError
				switch {
				case tt.damage && (!errors.As(err, &fe) || fe.Offset != int64(second)):
					t.Errorf("Next = %v, want a format error at %d", err, second)
				case !tt.damage && !errors.Is(err, ErrTruncated):
					t.Errorf("Next = %v, want ErrTruncated", err)
				}
			})
		}
	}
}

// TestDecoderTornTailRepaired: a decoder that read, with the frames
// before it, the start of a torn tail reads the frame a writer has since
// written in its place whole, not the torn frame's first bytes with the
// new frame's rest (the checksum covers the payload only: a frame under
// another key would pass).
func TestDecoderTornTailRepaired(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: DefaultBeaconInterval}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]Frame{{Key: "k1", Payload: []byte("before")}, {Key: "k1", TimestampMs: 11, Payload: bytes.Repeat([]byte("t"), 100)}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	_, offsets := readFrames(t, path)
	if err := os.Truncate(path, offsets[1]+20); err != nil { // the torn tail: the second frame's first 20 bytes
		t.Fatal(err)
	}
	d := openDecoder(t, path)
	if rec, err := d.Next(); err != nil || string(rec.Payload) != "before" {
		t.Fatalf("Next = %v, %v; want the first frame", rec, err)
	}

	w, err = OpenWriter(path, CreateOptions{}) // removes the torn tail, writes in its place
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]Frame{{Key: "k2", TimestampMs: 22, Payload: []byte("for k2 only, and longer than twenty bytes")}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	rec, err := d.Next()
	if err != nil || rec.Key != "k2" || rec.TimestampMs != 22 || string(rec.Payload) != "for k2 only, and longer than twenty bytes" {
		t.Fatalf("Next = %+v, %v; want the k2 frame written in place of the torn tail", rec, err)
	}
}

// repairedReader reads from torn once, then from repaired: a file whose
// torn tail a writer truncated and wrote anew between two reads.
type repairedReader struct {
	torn, repaired []byte
	reads          int
}

func (r *repairedReader) ReadAt(p []byte, off int64) (int, error) {
	r.reads++
	b := r.repaired
	if r.reads == 1 {
		b = r.torn
	}
	return bytes.NewReader(b).ReadAt(p, off)
}

// TestDecoderTornTailRepairedDuringNext: a read that finds the end of the
// file inside a frame ends the call there, rather than read the rest,
// which a writer may have written since in place of a torn frame.
func TestDecoderTornTailRepairedDuringNext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: DefaultBeaconInterval}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]Frame{{Key: "k1", TimestampMs: 11, Payload: bytes.Repeat([]byte("t"), 100)}}); err != nil {
		t.Fatal(err)
	}
	full, _ := os.ReadFile(path)
	torn := full[:HeaderSize+20]
	if err := os.Truncate(path, HeaderSize); err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]Frame{{Key: "k2", TimestampMs: 22, Payload: []byte("for k2 only, and longer than twenty bytes")}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	repaired, _ := os.ReadFile(path)
	h, err := ParseHeader(repaired)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecoder(&repairedReader{torn: torn, repaired: repaired}, h, HeaderSize)
	if rec, err := d.Next(); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Next = %+v, %v; want ErrTruncated at the end of the torn file", rec, err)
	}
	rec, err := d.Next()
	if err != nil || rec.Key != "k2" || rec.TimestampMs != 22 {
		t.Fatalf("Next = %+v, %v; want the k2 frame whole", rec, err)
	}
}

// failingAfter is a file whose reads fail with EIO past limit, after the
// bytes before it, as a bad sector reads.
type failingAfter struct {
	data  []byte
	limit int64
}

func (f failingAfter) ReadAt(p []byte, off int64) (int, error) {
	if off >= f.limit {
		return 0, syscall.EIO
	}
	n := copy(p, f.data[off:min(f.limit, int64(len(f.data)))])
	if off+int64(n) < int64(len(f.data)) && n < len(p) {
		return n, syscall.EIO
	}
	return n, nil
}

// TestDecoderReadErrorInAFrame: a read that fails after some bytes of a
// frame is an error, not the end of the data: a torn frame, which readers
// wait at, it is not.
func TestDecoderReadErrorInAFrame(t *testing.T) {
	data := writtenFile(t, DefaultBeaconInterval, []Frame{{Key: "k1", Payload: []byte("before")}, {Key: "k1", Payload: bytes.Repeat([]byte("t"), 100)}})
	second := int64(HeaderSize + 1 + len("k1") + 28 + len("before") + 3) // the offset of the second frame
	h, err := ReadHeader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range readSizes {
		d := NewDecoder(failingAfter{data, second + 20}, h, HeaderSize)
		d.ReadSize = size
		if rec, err := d.Next(); err != nil || string(rec.Payload) != "before" {
			t.Fatalf("read size %d: Next = %v, %v; want the first frame", size, rec, err)
		}
		if _, err := d.Next(); !errors.Is(err, syscall.EIO) {
			t.Errorf("read size %d: Next = %v, want the read error", size, err)
		}
	}
}

// writtenFile returns the bytes of a file of interval whose frames are
// frames, written as a writer writes them.
func writtenFile(t *testing.T, interval uint32, frames []Frame) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "large.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "large.ss", BeaconInterval: interval}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish(frames); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// largePayload is a payload of n bytes that no shift of it matches.
func largePayload(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7+i>>8) ^ seed
	}
	return p
}

// TestDecoderLetsGoOfALargeFrame: a frame larger than the decoder keeps
// memory for costs about its payload to read, once (not a buffer grown a
// part at a time, each part copied again, with the payload copied besides),
// and once the next call has moved past it the decoder holds neither it
// nor the memory it took: the read buffer and the payload scratch are back
// within keepSize, what a record of the default beacon interval needs.
// Whether beacons cut the payload into parts smaller than a read (an
// interval of 1 KiB), larger (1 MiB), or none does (8 MiB), whatever the
// read size.
func TestDecoderLetsGoOfALargeFrame(t *testing.T) {
	const size = 3 << 20 // above keepSize
	big := largePayload(size, 1)
	for _, interval := range []uint32{1024, DefaultBeaconInterval, 8 << 20} {
		file := writtenFile(t, interval, []Frame{{Key: "k", Payload: []byte("before")}, {Key: "k", Payload: big}, {Key: "k", Payload: []byte("after")}})
		h, err := ParseHeader(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, readSize := range readSizes {
			t.Run(fmt.Sprintf("interval=%d/readsize=%d", interval, readSize), func(t *testing.T) {
				d := newTestDecoder(file, h, readSize)
				if rec, err := d.Next(); err != nil || string(rec.Payload) != "before" {
					t.Fatalf("Next = %v, %v; want the record before", rec, err)
				}
				var ms0, ms1 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				rec, err := d.Next()
				runtime.ReadMemStats(&ms1)
				if err != nil || !bytes.Equal(rec.Payload, big) {
					t.Fatalf("Next = %v; want the large record whole", err)
				}
				if a := ms1.TotalAlloc - ms0.TotalAlloc; a > size+size/4 {
					t.Errorf("reading a frame of %d bytes allocated %d bytes, want about the payload", size, a)
				}
				if rec, err := d.Next(); err != nil || string(rec.Payload) != "after" {
					t.Fatalf("Next = %v, %v; want the record after", rec, err)
				}
				if cap(d.buf) > d.keepSize() || cap(d.scratch) > d.keepSize() {
					t.Errorf("past the large frame, the decoder keeps a read buffer of %d bytes and a payload scratch of %d; want at most %d each",
						cap(d.buf), cap(d.scratch), d.keepSize())
				}
				if _, err := d.Next(); !errors.Is(err, io.EOF) {
					t.Fatalf("Next = %v, want io.EOF", err)
				}
			})
		}
	}
}

// TestDecoderLargeFrameHeapAfterwards: after a large frame, a decoder
// that reached the end of the file leaves, once collected, no more live
// heap than a few reads' worth, whatever the frame's size. A decoder that
// kept its buffers would keep the frame's size, or more.
func TestDecoderLargeFrameHeapAfterwards(t *testing.T) {
	const size = 24 << 20
	file := writtenFile(t, DefaultBeaconInterval, []Frame{{Key: "k", Payload: largePayload(size, 2)}})
	h, err := ParseHeader(file)
	if err != nil {
		t.Fatal(err)
	}
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	d := newTestDecoder(file, h, 0)
	if rec, err := d.Next(); err != nil || len(rec.Payload) != size {
		t.Fatalf("Next = %v; want the large record", err)
	}
	if _, err := d.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("Next = %v, want io.EOF", err)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	runtime.KeepAlive(d)
	if kept := int64(ms1.HeapAlloc) - int64(ms0.HeapAlloc); kept > 4<<20 {
		t.Errorf("a decoder past a frame of %d bytes keeps %d bytes of heap, want at most 4 MiB", size, kept)
	}
}

// TestDecoderSmallRecordsAllocateNothing: in steady state, reading a
// record allocates nothing: small ones between beacons or cut by them, and
// those up to keepSize (here 512 KiB, cut by the beacons of the default
// interval), whose memory the decoder keeps; also after a frame larger
// than that, whose memory it let go.
func TestDecoderSmallRecordsAllocateNothing(t *testing.T) {
	var frames []Frame
	add := func(n, size int) {
		for i := range n {
			frames = append(frames, Frame{Key: "k", Payload: largePayload(size+i%37, byte(i))})
		}
	}
	tests := []struct {
		name     string
		interval uint32
		build    func()
	}{
		{"small, many cut by beacons", 4096, func() { add(3000, 300) }},
		{"512KiB, cut by beacons", DefaultBeaconInterval, func() { add(300, 512<<10) }},
		{"small after a large frame", 4096, func() { add(1, 3<<20); add(3000, 300) }},
	}
	for _, tt := range tests {
		frames = nil
		tt.build()
		file := writtenFile(t, tt.interval, frames)
		h, err := ParseHeader(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, readSize := range readSizes {
			t.Run(fmt.Sprintf("%s/readsize=%d", tt.name, readSize), func(t *testing.T) {
				d := newTestDecoder(file, h, readSize)
				next := func() {
					if _, err := d.Next(); err != nil {
						t.Fatal(err)
					}
				}
				for range 20 { // the memory grows to what the records need
					next()
				}
				runs := len(frames) - 40
				if allocs := testing.AllocsPerRun(runs, next); allocs != 0 {
					t.Errorf("%v allocations per record, want 0", allocs)
				}
			})
		}
	}
}

// TestDecoderLargeFrameTornThenWhole: a large frame whose payload the
// file ends in is torn (ErrTruncated, the position at its start), which
// costs no more memory than the bytes there (a size field damaged to claim
// up to 64 MiB would cost that much at every try), and is read whole once
// the rest is there; one that a writer removed and wrote anew
// in its place, with other fields and payload, is read as the new one,
// not with the torn one's fields; a read that fails in its payload is a
// read error; and a large frame found bad after its payload (a timestamp
// past year 9999) leaves the decoder at it, reporting it again.
func TestDecoderLargeFrameTornThenWhole(t *testing.T) {
	const size = 3 << 20
	first := largePayload(size, 3)
	file := writtenFile(t, DefaultBeaconInterval, []Frame{{Key: "k", Payload: []byte("before")}, {Key: "k", Payload: first}})
	h, err := ParseHeader(file)
	if err != nil {
		t.Fatal(err)
	}
	start := int64(HeaderSize + 1 + 1 + 28 + len("before") + 3)

	t.Run("torn, then whole", func(t *testing.T) {
		g := &growingReader{data: file, size: start + size/2}
		d := NewDecoder(g, h, HeaderSize)
		if rec, err := d.Next(); err != nil || string(rec.Payload) != "before" {
			t.Fatalf("Next = %v, %v; want the record before", rec, err)
		}
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		_, err := d.Next()
		runtime.ReadMemStats(&ms1)
		if !errors.Is(err, ErrTruncated) || d.Pos() != start {
			t.Fatalf("Next = %v at %d; want ErrTruncated at %d", err, d.Pos(), start)
		}
		if a := ms1.TotalAlloc - ms0.TotalAlloc; a > size/2+size/8 {
			t.Errorf("a frame of %d bytes of payload, %d of them in the file, allocated %d bytes; want no more than those there", size, size/2, a)
		}
		g.size = int64(len(file))
		if rec, err := d.Next(); err != nil || !bytes.Equal(rec.Payload, first) {
			t.Fatalf("Next = %v; want the large record whole", err)
		}
	})

	t.Run("torn, then written anew", func(t *testing.T) {
		// The torn frame ends in the first read, with the record before.
		torn := file[:start+100]
		second := largePayload(size+5000, 4)
		repaired := writtenFile(t, DefaultBeaconInterval, []Frame{{Key: "k", Payload: []byte("before")}, {Key: "other", Shard: 9, Payload: second}})
		d := NewDecoder(&repairedReader{torn: torn, repaired: repaired}, h, HeaderSize)
		if rec, err := d.Next(); err != nil || string(rec.Payload) != "before" {
			t.Fatalf("Next = %v, %v; want the record before", rec, err)
		}
		rec, err := d.Next()
		if err != nil || rec.Key != "other" || rec.Shard != 9 || !bytes.Equal(rec.Payload, second) {
			t.Fatalf("Next = %v; want the frame written anew, whole", err)
		}
	})

	t.Run("a read error in the payload", func(t *testing.T) {
		d := NewDecoder(failingAfter{file, start + size/2}, h, HeaderSize)
		if rec, err := d.Next(); err != nil || string(rec.Payload) != "before" {
			t.Fatalf("Next = %v, %v; want the record before", rec, err)
		}
		if _, err := d.Next(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("Next = %v, want the read error", err)
		}
	})

	t.Run("bad after its payload", func(t *testing.T) {
		bad := slices.Clone(file)
		binary.BigEndian.PutUint64(bad[start+1+1+16:], maxTimestampMs+1)
		for _, readSize := range readSizes {
			d := newTestDecoder(bad, h, readSize)
			if _, err := d.Next(); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				var fe *FormatError
				if _, err := d.Next(); !errors.As(err, &fe) || fe.Offset != start || d.Pos() != start {
					t.Fatalf("read size %d: Next = %v at %d; want the format error at %d", readSize, err, d.Pos(), start)
				}
			}
		}
	})
}

// growingReader reads data up to size, as a file being written.
type growingReader struct {
	data []byte
	size int64
}

func (g *growingReader) Size() int64 { return g.size }

func (g *growingReader) ReadAt(p []byte, off int64) (int, error) {
	return bytes.NewReader(g.data[:g.size]).ReadAt(p, off)
}
