package streamfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// FuzzDecoder feeds arbitrary files to the decoder. It must never panic nor
// loop, and every frame it accepts must survive a round trip: written again
// by a Writer into a file with the same header, the frames decode the same.
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
	f.Fuzz(decodeRoundTrip)
}

// decodeRoundTrip is the body of FuzzDecoder.
func decodeRoundTrip(t *testing.T, file []byte) {
	r := bytes.NewReader(file)
	h, err := ReadHeader(r)
	if err != nil {
		return
	}
	d := NewDecoder(r, h, HeaderSize)
	d.ReadSize = 97 // odd reads exercise the buffer edges
	var frames []Frame
	for i := 0; ; i++ {
		if i > len(file) {
			t.Fatal("more frames than bytes: the decoder loops")
		}
		rec, err := d.Next()
		var ce *ChecksumError
		if errors.As(err, &ce) {
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, ErrTruncated) || errors.Is(err, ErrEndOfStream) {
				break
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			break
		}
		if rec.End <= rec.Offset || rec.End > int64(len(file)) {
			t.Fatalf("frame at %d ends at %d (file %d bytes)", rec.Offset, rec.End, len(file))
		}
		fr := rec.Frame
		fr.Payload = bytes.Clone(rec.Payload)
		frames = append(frames, fr)
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
