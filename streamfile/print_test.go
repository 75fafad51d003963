package streamfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/envelope"
)

// TestPrintVectors prints every vector as ndjson: the output equals its
// expected file byte for byte, and Print ends with the error the file
// holds, at the frame the error is about.
func TestPrintVectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error // nil, ErrTruncated, or a *ChecksumError
		pos  int64 // for ErrTruncated
	}{
		{name: "sample-1"}, {name: "consumer"}, {name: "quicksort"}, {name: "edge-a-spliced"},
		{name: "edge-b-truncated", want: ErrTruncated, pos: 2087},
		{name: "edge-c-badcrc", want: &ChecksumError{}},
		{name: "edge-d-eos"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, err := os.ReadFile(filepath.Join(vectorDir, tc.name+".ss"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(vectorDir, tc.name+".expected.ndjson"))
			if err != nil {
				t.Fatal(err)
			}
			h, err := ReadHeader(bytes.NewReader(file))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			pos, err := FormatNDJSON.Print(&out, bytes.NewReader(file), &h, int64(len(file)))
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("output differs from %s.expected.ndjson:\n%s", tc.name, out.String())
			}
			var ce *ChecksumError
			switch {
			case tc.want == nil && err != nil,
				errors.Is(tc.want, ErrTruncated) && (!errors.Is(err, ErrTruncated) || pos != tc.pos),
				errors.As(tc.want, &ce) && !errors.As(err, &ce):
				t.Errorf("Print = %d, %v; want %v", pos, err, tc.want)
			}
		})
	}
}

// TestAppendError: the terminal line of each kind of damage, in both
// formats; other errors print nothing.
func TestAppendError(t *testing.T) {
	for _, tc := range []struct {
		err      error
		log, nd  string
		pos, end int64
	}{
		{err: &ChecksumError{Offset: 2087, Received: 31089, Computed: 42989},
			log: "# error: checksum mismatch in the frame at offset 2087: stored 31089, computed 42989\n",
			nd:  `{"error":"checksum","offset":2087,"received":31089,"computed":42989}` + "\n"},
		{err: &FormatError{Offset: 128, Reason: `invalid stream key "/ello"`},
			log: "# error: format error at offset 128: invalid stream key \"/ello\"\n",
			nd:  `{"error":"format","offset":128,"reason":"invalid stream key \"/ello\""}` + "\n"},
		{err: fmt.Errorf("read: %w", ErrTruncated), pos: 2087, end: 3500,
			log: "# error: truncated: the frame at offset 2087 is incomplete (file size 3500)\n",
			nd:  `{"error":"truncated","offset":2087,"file_size":3500}` + "\n"},
		{err: errors.New("read at offset 200: input/output error")},
		{},
	} {
		for _, f := range []struct {
			p    Format
			want string
		}{{FormatLog, tc.log}, {FormatNDJSON, tc.nd}} {
			if got := string(f.p.AppendError([]byte("x"), tc.err, tc.pos, tc.end)); got != "x"+f.want {
				t.Errorf("format %d, %v: %q, want %q", f.p, tc.err, got, "x"+f.want)
			}
		}
	}
}

// TestPrintWriteError: Print stops at the first failed write and returns
// its error, as a *WriteError.
func TestPrintWriteError(t *testing.T) {
	file, err := os.ReadFile(filepath.Join(vectorDir, "consumer.ss"))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := ReadHeader(bytes.NewReader(file))
	w := &failingWriter{after: 3}
	_, err = FormatLog.Print(w, bytes.NewReader(file), &h, int64(len(file)))
	if _, ok := errors.AsType[*WriteError](err); !ok || !errors.Is(err, errWrite) || w.writes != 4 {
		t.Fatalf("Print = %v after %d writes, want errWrite at the 4th", err, w.writes)
	}
}

var errWrite = errors.New("write failed")

// failingWriter fails every write after the first after ones.
type failingWriter struct{ after, writes int }

func (w *failingWriter) Write(p []byte) (int, error) {
	w.writes++
	if w.writes > w.after {
		return 0, errWrite
	}
	return len(p), nil
}

// TestFormatUnmarshalText: the two names, and the message for any other.
func TestFormatUnmarshalText(t *testing.T) {
	for name, want := range map[string]Format{"log": FormatLog, "ndjson": FormatNDJSON} {
		var f Format
		if err := f.UnmarshalText([]byte(name)); f != want || err != nil {
			t.Errorf("UnmarshalText(%q): %d, %v", name, f, err)
		}
		if text, _ := f.WithHeaders().MarshalText(); string(text) != name {
			t.Errorf("MarshalText of %s with headers: %s", name, text)
		}
	}
	var f Format
	if err := f.UnmarshalText([]byte("xml")); err == nil || err.Error() != `unknown format "xml": use log or ndjson` {
		t.Errorf("UnmarshalText(xml): %v", err)
	}
}

// TestPrintFile: a whole file prints as its expected ndjson; a file that
// cannot be opened, and one that is not a stream file, are told apart; a
// truncated file stops at the frame the end cuts.
func TestPrintFile(t *testing.T) {
	var out bytes.Buffer
	pos, size, err := FormatNDJSON.PrintFile(&out, filepath.Join(vectorDir, "consumer.ss"))
	want, rerr := os.ReadFile(filepath.Join(vectorDir, "consumer.expected.ndjson"))
	if err != nil || rerr != nil || out.String() != string(want) || pos != size {
		t.Errorf("consumer.ss: pos %d of %d, %v; output equal to the expected: %v", pos, size, err, out.String() == string(want))
	}
	if _, _, err := FormatLog.PrintFile(io.Discard, filepath.Join(t.TempDir(), "nope.ss")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want fs.ErrNotExist", err)
	}
	short := filepath.Join(t.TempDir(), "short.ss")
	if err := os.WriteFile(short, []byte("Ss\x01"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = FormatLog.PrintFile(io.Discard, short)
	if he, ok := errors.AsType[*HeaderError](err); !ok || !strings.Contains(he.Error(), "shorter than the 128-byte header") {
		t.Errorf("a 3-byte file: %v, want a *HeaderError saying it is short", err)
	}
	out.Reset()
	pos, size, err = FormatNDJSON.PrintFile(&out, filepath.Join(vectorDir, "edge-b-truncated.ss"))
	if !errors.Is(err, ErrTruncated) || pos >= size || !strings.Contains(out.String(), `"error":"truncated"`) {
		t.Errorf("edge-b-truncated.ss: pos %d of %d, %v; output %q", pos, size, err, out.String())
	}
	if _, _, err := FormatLog.PrintFile(&failingWriter{}, filepath.Join(vectorDir, "consumer.ss")); !errors.Is(err, errWrite) {
		t.Errorf("a failing writer: %v, want its error", err)
	}
}

// TestAppendRecordWithHeaders checks the lines of records with and without
// an envelope under WithHeaders: headers shown, the payload inside the
// envelope in place of its text, and the plain formats unchanged.
func TestAppendRecordWithHeaders(t *testing.T) {
	h := envelope.Headers{{Name: "source", Value: []byte("make-run")}, {Name: "note", Value: []byte("a\tb")}, {Name: "blob", Value: []byte{0, 0xff}}}
	enveloped := &Record{Frame: Frame{Key: "orders", Seq: 7, TimestampMs: 1700000000500, Payload: envelope.Encode(h, []byte("hi"), true)}, Offset: 128, Checksum: 4660}
	plain := &Record{Frame: Frame{Key: "orders", Seq: 8, TimestampMs: 1700000000500, Payload: []byte("plain")}, Offset: 256, Checksum: 17}
	for _, tc := range []struct {
		p    Format
		r    *Record
		want string
	}{
		{FormatLog.WithHeaders(), enveloped, "[2023-11-14T22:13:20.5 | orders | 7 | 0] hi\n#   source: make-run\n#   note: \"a\\tb\"\n#   blob: \"\\x00\\xff\"\n"},
		{FormatNDJSON.WithHeaders(), enveloped, `{"offset":128,"stream_key":"orders","shard_id":0,"seq":7,"timestamp_ms":1700000000500,` +
			`"headers":{"source":"make-run","note":"a\tb"},"headers_b64":{"blob":"AP8="},"payload_b64":"aGk=","checksum":4660}` + "\n"},
		{FormatLog.WithHeaders(), plain, "[2023-11-14T22:13:20.5 | orders | 8 | 0] plain\n"},
		{FormatNDJSON.WithHeaders(), plain, `{"offset":256,"stream_key":"orders","shard_id":0,"seq":8,"timestamp_ms":1700000000500,"headers":{},"payload_b64":"cGxhaW4=","checksum":17}` + "\n"},
		{FormatNDJSON, plain, `{"offset":256,"stream_key":"orders","shard_id":0,"seq":8,"timestamp_ms":1700000000500,"payload_b64":"cGxhaW4=","checksum":17}` + "\n"},
	} {
		if got := string(tc.p.AppendRecord(nil, tc.r)); got != tc.want {
			t.Errorf("format %d, seq %d:\n got  %q\n want %q", tc.p, tc.r.Seq, got, tc.want)
		}
	}
	if got := string(FormatLog.AppendRecord(nil, enveloped)); !strings.HasSuffix(got, "] "+string(enveloped.Payload)+"\n") {
		t.Errorf("the log format without headers changed the envelope: %q", got)
	}
}
