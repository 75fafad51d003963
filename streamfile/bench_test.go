package streamfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// benchSizes are the payload sizes of the throughput benchmarks.
var benchSizes = []struct {
	name    string
	payload int
}{{"64B", 64}, {"1KiB", 1 << 10}, {"64KiB", 64 << 10}}

// benchTotal is the size of each benchmark file.
const benchTotal = 64 << 20

// benchFile writes (once per payload size) a file of about benchTotal bytes
// with the default 1 MiB beacon interval and returns its path and frame
// count. The first call in a process also resets how the page cache holds
// the file (see cacheAsRead).
func benchFile(b *testing.B, payload int) (string, int) {
	b.Helper()
	path := filepath.Join(os.TempDir(), fmt.Sprintf("streamd-bench-%d.ss", payload))
	n := benchTotal / (payload + 38)
	if fi, err := os.Stat(path); err != nil || fi.Size() <= benchTotal/2 {
		writeBenchFile(b, path, payload, n)
	}
	if !benchCached[path] {
		cacheAsRead(b, path)
		benchCached[path] = true
	}
	return path, n
}

// benchCached records the files cacheAsRead has run on in this process.
var benchCached = map[string]bool{}

// cacheAsRead drops the file at path from the page cache and reads it back,
// so that the kernel holds it as it holds a file read from disk (in the
// large folios of its read-ahead), whatever wrote it and whatever evicted
// and read parts of it since. That history decided how fast its pages could
// be copied: the same file read at 4 or at 8 GB/s on this machine,
// which moved the decode figures from one run to the next. On tmpfs, where
// the file stays in memory, this changes nothing.
func cacheAsRead(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyBuffer(io.Discard, f, make([]byte, 1<<20)); err != nil {
		b.Fatal(err)
	}
}

func writeBenchFile(b *testing.B, path string, payload, n int) {
	os.Remove(path)
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "bench.ss", BeaconInterval: DefaultBeaconInterval}})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	p := make([]byte, payload)
	for i := range p {
		p[i] = byte(i * 7)
	}
	batch := make([]Frame, 0, 256)
	for i := range n {
		batch = append(batch, Frame{Key: "orders", Seq: uint64(i + 1), TimestampMs: 1_700_000_000_000, Payload: p})
		if len(batch) == cap(batch) || i == n-1 {
			if err := w.Append(batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// BenchmarkDecode decodes a whole file per iteration from the page cache
// through reads into the decoder's buffer, as a follower and streamd decode
// do.
func BenchmarkDecode(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("payload="+s.name, func(b *testing.B) {
			path, n := benchFile(b, s.payload)
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			h, err := ReadHeader(f)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(fi.Size())
			b.ReportAllocs()
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			for b.Loop() {
				decodeCount(b, NewDecoder(f, h, HeaderSize), n)
			}
			runtime.ReadMemStats(&ms1)
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(n)/float64(b.N), "allocs/record")
		})
	}
}

// decodeCount decodes to the end and fails unless there were n frames.
func decodeCount(b *testing.B, d *Decoder, n int) {
	got := 0
	for {
		if _, err := d.Next(); err != nil {
			if !errors.Is(err, io.EOF) {
				b.Fatal(err)
			}
			break
		}
		got++
	}
	if got != n {
		b.Fatalf("decoded %d frames, want %d", got, n)
	}
}

// BenchmarkCRC is a bare CRC-16 pass over the bytes of the same files, held
// in memory: the floor that decoding is compared with.
func BenchmarkCRC(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("payload="+s.name, func(b *testing.B) {
			path, _ := benchFile(b, s.payload)
			data, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			var sum uint16
			for b.Loop() {
				sum ^= CRC16(data)
			}
			_ = sum
		})
	}
}

// BenchmarkRead is a plain read of the same files through ReadAt in
// 256 KiB chunks, the decoder's read size.
func BenchmarkRead(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("payload="+s.name, func(b *testing.B) {
			path, _ := benchFile(b, s.payload)
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			b.SetBytes(fi.Size())
			buf := make([]byte, defaultReadSize)
			for b.Loop() {
				for off := int64(0); off < fi.Size(); off += int64(len(buf)) {
					if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkAppend appends batches of up to 1024 frames and 1 MiB to a file
// with the default interval; the file is recreated whenever it passes
// benchTotal.
func BenchmarkAppend(b *testing.B) {
	for _, s := range benchSizes {
		b.Run("payload="+s.name, func(b *testing.B) {
			dir := b.TempDir()
			p := make([]byte, s.payload)
			batch := make([]Frame, min(1024, max(1, (1<<20)/s.payload)))
			for i := range batch {
				batch[i] = Frame{Key: "orders", Seq: uint64(i), TimestampMs: 1_700_000_000_000, Payload: p}
			}
			frameSize := batch[0].Size()
			b.SetBytes(frameSize * int64(len(batch)))
			b.ReportAllocs()
			var w *Writer
			open := func() {
				path := filepath.Join(dir, "append.ss")
				os.Remove(path)
				var err error
				w, err = OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "append.ss", BeaconInterval: DefaultBeaconInterval}})
				if err != nil {
					b.Fatal(err)
				}
			}
			open()
			for b.Loop() {
				if w.Size() > benchTotal {
					b.StopTimer()
					w.Close()
					open()
					b.StartTimer()
				}
				if err := w.Append(batch...); err != nil {
					b.Fatal(err)
				}
			}
			w.Close()
			b.ReportMetric(float64(len(batch))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// hugeRecordFile writes (once per interval) a file of one payload of
// hugePayload bytes, near the decoder's limit, between two small records,
// and returns its path.
func hugeRecordFile(tb testing.TB, interval uint32) string {
	tb.Helper()
	path := filepath.Join(os.TempDir(), fmt.Sprintf("streamd-bench-huge-%d.ss", interval))
	if fi, err := os.Stat(path); err == nil && fi.Size() > hugePayload {
		return path
	}
	os.Remove(path)
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "huge.ss", BeaconInterval: interval}})
	if err != nil {
		tb.Fatal(err)
	}
	defer w.Close()
	p := make([]byte, hugePayload)
	for i := range p {
		p[i] = byte(i * 7)
	}
	if err := w.Publish([]Frame{{Key: "big", Payload: []byte("before")}, {Key: "big", Payload: p}, {Key: "big", Payload: []byte("after")}}); err != nil {
		tb.Fatal(err)
	}
	return path
}

// hugePayload is the payload of the huge record: 60 MiB.
const hugePayload = 60 << 20

// BenchmarkDecodeHugeRecord decodes a file whose middle record is 60 MiB,
// with the default 1 MiB interval (beacons cut the payload) and with an
// interval larger than the record (none does). It reports the bytes
// allocated per decode and what the decoder still holds, after a
// collection, once it reached the end of the file ("retained-B").
func BenchmarkDecodeHugeRecord(b *testing.B) {
	for _, interval := range []uint32{DefaultBeaconInterval, 128 << 20} {
		b.Run(fmt.Sprintf("interval=%dMiB", interval>>20), func(b *testing.B) {
			path := hugeRecordFile(b, interval)
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			h, err := ReadHeader(f)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(hugePayload)
			b.ReportAllocs()
			var retained uint64
			for b.Loop() {
				var ms0, ms1 runtime.MemStats
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&ms0)
				b.StartTimer()
				d := NewDecoder(f, h, HeaderSize)
				decodeCount(b, d, 3)
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&ms1)
				runtime.KeepAlive(d)
				retained += ms1.HeapAlloc - min(ms0.HeapAlloc, ms1.HeapAlloc)
				b.StartTimer()
			}
			b.ReportMetric(float64(retained)/float64(b.N), "retained-B")
		})
	}
}
