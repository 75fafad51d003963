package streamfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// FuzzDecoder feeds arbitrary files to the decoder. It must never panic nor
// loop, it must decode the same through small reads and whole, and every frame
// it accepts must survive a round trip: written again by a Writer into a
// file with the same header, the frames decode the same. A whole frame
// WholeFrameAfter finds must be one the decoder reads.
func FuzzDecoder(f *testing.F) {
	for _, name := range vectorNames {
		b, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	small, _ := AppendHeader(nil, &Header{FileName: "s", BeaconInterval: 128})
	f.Add(append(small, bytes.Repeat([]byte{0x0D, 0, 0, 0, 5, 0, 0x0D}, 30)...))
	// No frame, and no beacon to skip to before the end.
	bad, _ := AppendHeader(nil, &Header{FileName: "b", BeaconInterval: 1024})
	f.Add(append(append(bad, 0xFF), bytes.Repeat([]byte{1}, 300)...))
	f.Fuzz(decodeRoundTrip)
}

// decodeRoundTrip is the body of FuzzDecoder.
func decodeRoundTrip(t *testing.T, file []byte) {
	h, err := ReadHeader(bytes.NewReader(file))
	if err != nil {
		return
	}
	// A whole frame the search for one reports is one the decoder reads.
	if p, err := WholeFrameAfter(bytes.NewReader(file), int64(h.BeaconInterval), HeaderSize, int64(len(file))); err != nil {
		t.Fatal(err)
	} else if p >= 0 {
		if _, err := NewDecoder(bytes.NewReader(file), h, p).Next(); err != nil {
			t.Fatalf("WholeFrameAfter found a frame at %d, the decoder reads %v", p, err)
		}
	}
	frames, events := fuzzDecode(t, file, h, readSizes[0])
	whole, wholeEvents := fuzzDecode(t, file, h, readSizes[1])
	if err := sameFrames(whole, frames); err != nil {
		t.Fatalf("read whole: %v", err)
	}
	if i := firstDifference(wholeEvents, events); i >= 0 {
		t.Fatalf("event %d differs: read whole %q, through small reads %q", i, wholeEvents[i:min(i+1, len(wholeEvents))], events[i:min(i+1, len(events))])
	}
	var valid []Frame
	for _, fr := range frames {
		if ValidKey(fr.Key) == nil {
			valid = append(valid, fr)
		}
	}
	if len(valid) == 0 || h.Validate() != nil {
		return
	}
	path := fuzzScratchFile(t)
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: h})
	if err != nil {
		t.Fatal(err)
	}
	// Closed on every path: a writer left open keeps its flock, and the
	// next iteration of the process would wait for it forever.
	defer w.Close()
	if err := w.Append(valid...); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got, _ := readFramesLenient(t, path)
	// A trailing end-of-stream frame stops the reader: compare up to it.
	want := valid
	for i, fr := range valid {
		if fr.IsEOS() {
			want = valid[:i+1]
			break
		}
	}
	if err := sameFrames(got, want); err != nil {
		t.Fatalf("round trip: %v", err)
	}
}

// fuzzDecode decodes file to its end, reading readSize bytes at a time,
// skipping the damage after a format error as readers do, and returns the frames
// (payloads copied, checksum errors left out) and what happened on the way:
// each record's place and checksum, each beacon, each error with the
// position it left.
func fuzzDecode(t *testing.T, file []byte, h Header, readSize int) (frames []Frame, events []string) {
	d := newTestDecoder(file, h, readSize)
	d.OnBeacon(func(at int64, b *Beacon) { events = append(events, fmt.Sprintf("beacon at %d: %+v", at, *b)) })
	for i := 0; ; i++ {
		if i > len(file) {
			t.Fatal("more frames than bytes: the decoder loops")
		}
		rec, err := d.Next()
		if err != nil {
			events = append(events, fmt.Sprintf("%v, then at %d", err, d.Pos()))
		}
		var ce *ChecksumError
		var fe *FormatError
		switch {
		case err == nil:
		case errors.As(err, &ce):
			continue
		case errors.Is(err, io.EOF), errors.Is(err, ErrTruncated), errors.Is(err, ErrEndOfStream):
			return frames, events
		case errors.As(err, &fe):
			if ok, err := d.SkipDamage(fe, int64(len(file))); err != nil || !ok {
				// The decoder stays at the bad frame, and says so again.
				_, again := d.Next()
				events = append(events, fmt.Sprintf("skipping: %v; then %v at %d", err, again, d.Pos()))
				return frames, events
			}
			continue
		default:
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
		if rec.End <= rec.Offset || rec.End > int64(len(file)) {
			t.Fatalf("frame at %d ends at %d (file %d bytes)", rec.Offset, rec.End, len(file))
		}
		events = append(events, fmt.Sprintf("record %d-%d checksum %d", rec.Offset, rec.End, rec.Checksum))
		fr := rec.Frame
		fr.Payload = bytes.Clone(rec.Payload)
		frames = append(frames, fr)
	}
}

// firstDifference returns the index of the first element where a and b
// differ, counting a missing element as a difference, or -1.
func firstDifference(a, b []string) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

var (
	scratchOnce sync.Once
	scratchPath string
)

// fuzzScratchFile returns an empty file for a fuzz iteration. One file per
// process is reused, in memory where /dev/shm exists: a temporary directory
// per iteration stalls the fuzzer on file system work.
func fuzzScratchFile(t *testing.T) string {
	scratchOnce.Do(func() {
		dir := "/dev/shm"
		if _, err := os.Stat(dir); err != nil {
			dir = os.TempDir()
		}
		f, err := os.CreateTemp(dir, "streamfile-fuzz-*.ss")
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		scratchPath = f.Name()
	})
	if err := os.Truncate(scratchPath, 0); err != nil {
		t.Fatal(err)
	}
	return scratchPath
}
