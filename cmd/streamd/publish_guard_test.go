package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/streamd/streamd/streamfile"
)

// TestPublishReservedKey: a line or --key naming a key the format reserves
// (the end-of-stream mark's, the wildcard's) is refused with the key named,
// and nothing of the run after the line before it is written: an
// end-of-stream frame in the middle would hide every later record.
func TestPublishReservedKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, stdin, key string
		args             []string
		code             int
	}{
		{"eos line", "[a] one\n[SEA_STREAMER_INTERNAL] EOS\n[a] two\n", "SEA_STREAMER_INTERNAL", nil, exitError},
		{"wildcard line", "[a] one\n[SEA_STREAMER_WILDCARD] x\n[a] two\n", "SEA_STREAMER_WILDCARD", nil, exitError},
		{"eos flag", "one\n", "SEA_STREAMER_INTERNAL", []string{"--key=SEA_STREAMER_INTERNAL"}, exitUsage},
		{"wildcard flag", "one\n", "SEA_STREAMER_WILDCARD", []string{"--key=SEA_STREAMER_WILDCARD"}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".ss")
			runBinaryOK(t, "zero", "publish", "--file="+path, "--key=a")
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := runBinary(t, []byte(tc.stdin), append([]string{"publish", "--file=" + path}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.key) || !strings.Contains(r.stderr, "reserved") {
				t.Fatalf("exit %d, stderr %q; want exit %d naming reserved key %s", r.code, r.stderr, tc.code, tc.key)
			}
			for _, f := range readFile(t, path) {
				if f.Key != "a" || string(f.Payload) != "zero" && string(f.Payload) != "one" {
					t.Fatalf("record %s %q was written; want only the records before the refused line", f.Key, f.Payload)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.HasPrefix(after, before) {
				t.Fatal("the records already in the file changed")
			}
		})
	}
}

// writeFrames writes frames as given (an end-of-stream frame too) into a new
// stream file at path with a 1024-byte interval.
func writeFrames(t *testing.T, path string, frames ...streamfile.Frame) {
	t.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: filepath.Base(path), BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(w.Append(frames...), w.Close()); err != nil {
		t.Fatal(err)
	}
}

// appendBytes adds raw bytes to the end of the file at path.
func appendBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// keyPayloads returns the payloads of key in the file at path, in file order.
func keyPayloads(t *testing.T, path, key string) []string {
	t.Helper()
	var got []string
	for _, f := range framesAt(t, path, key) {
		got = append(got, string(f.Payload))
	}
	return got
}

// TestPublishDamagedFile: publish onto a file whose readable records do not
// reach its end (an end-of-stream frame in the middle, damage after the last
// good frame) is refused with the offset and what is there named, the file
// unchanged byte for byte; `streamd repair` then says what it discards and
// truncates to the last good frame, and what is published after it is read.
// It refuses, changing nothing, without --force when readers that skip the
// damage read records after it.
// Zeros from the last good frame to the end, what a crash can leave, are
// repaired by publish itself, which says so.
func TestPublishDamagedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	frame := func(p string) streamfile.Frame {
		return streamfile.Frame{Key: "k", Seq: 1, TimestampMs: 1700000000000, Payload: []byte(p)}
	}
	eos := streamfile.Frame{Key: streamfile.EOSKey, TimestampMs: 1700000000000, Payload: []byte(streamfile.EOSPayload)}

	midEOS := filepath.Join(dir, "mid-eos.ss")
	writeFrames(t, midEOS, frame("a"), eos, frame("hidden"))
	junk := filepath.Join(dir, "junk.ss")
	writeFrames(t, junk, frame("a"))
	appendBytes(t, junk, bytes.Repeat([]byte{0xAB}, 40))
	badSum := filepath.Join(dir, "bad-checksum.ss")
	writeFrames(t, badSum, frame("a"), frame("x"))
	b, err := os.ReadFile(badSum)
	if err != nil {
		t.Fatal(err)
	}
	b[162+1+1+24+4] ^= 0xFF // the payload of the last frame
	if err := os.WriteFile(badSum, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// A size field damaged to run past the end reads like a torn frame,
	// which publish would cut off with the whole frames after it.
	badSize := filepath.Join(dir, "bad-size.ss")
	writeFrames(t, badSize, frame("a"), frame("x"), frame("y"))
	b, err = os.ReadFile(badSize)
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint32(b[162+1+1+24:], 1000)
	if err := os.WriteFile(badSize, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want string
		readOn     string // what readers skipping the damage read after it, which repair keeps without --force
	}{
		{midEOS, "offset 162 of 257 bytes: an end-of-stream frame", ""}, // readers stop at the end-of-stream frame
		{badSize, "offset 162 of 230 bytes: streamfile: format error at offset 162: a frame that runs past the end of the file, yet a whole frame follows at offset 196", "key k: 1 record, seq 1 to 1"},
		{junk, "offset 162 of 202 bytes", ""},
		{badSum, "offset 162 of 196 bytes: streamfile: checksum mismatch", ""},
	} {
		before, _ := os.ReadFile(tc.path)
		r := runBinary(t, []byte("b\n"), "publish", "--file="+tc.path, "--key=k")
		if r.code != exitError || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "streamd repair") {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 naming %q and streamd repair", filepath.Base(tc.path), r.code, r.stderr, tc.want)
		}
		if after, _ := os.ReadFile(tc.path); !bytes.Equal(before, after) {
			t.Errorf("%s changed", filepath.Base(tc.path))
		}
		if tc.readOn != "" {
			r = runBinary(t, nil, "repair", tc.path)
			if r.code != exitError || !strings.Contains(r.stderr, "nothing was changed: truncating there would discard 1 record after it") || !strings.Contains(r.stderr, tc.readOn) || !strings.Contains(r.stderr, "--force") {
				t.Errorf("repair %s: exit %d, stderr %q; want exit 1 naming %q and --force", filepath.Base(tc.path), r.code, r.stderr, tc.readOn)
			}
			if after, _ := os.ReadFile(tc.path); !bytes.Equal(before, after) {
				t.Errorf("%s changed by a refused repair", filepath.Base(tc.path))
			}
		}
		r = runBinary(t, nil, "repair", "--force", tc.path)
		if r.code != exitOK || !strings.Contains(r.stderr+r.stdout, "discard") {
			t.Fatalf("repair %s: exit %d, out %q, stderr %q", filepath.Base(tc.path), r.code, r.stdout, r.stderr)
		}
		runBinaryOK(t, "b\nc", "publish", "--file="+tc.path, "--key=k")
		if got := keyPayloads(t, tc.path, "k"); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Errorf("%s after repair holds %q, want a b c", filepath.Base(tc.path), got)
		}
	}

	zeros := filepath.Join(dir, "zeros.ss")
	writeFrames(t, zeros, frame("a"))
	appendBytes(t, zeros, make([]byte, 100))
	r := runBinary(t, []byte("b\n"), "publish", "--file="+zeros, "--key=k")
	if r.code != exitOK || !strings.Contains(r.stderr, "removed the zero bytes a crash left") || !strings.Contains(r.stderr, "bytes=100") {
		t.Errorf("zeros: exit %d, stderr %q; want exit 0 and the repair said", r.code, r.stderr)
	}
	if got := keyPayloads(t, zeros, "k"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("zeros.ss holds %q, want a b", got)
	}
}

// TestPublishNonASCIIFileName: the header of a file streamd creates under a
// non-ASCII name holds the name in an ASCII form (its non-ASCII bytes as
// %XX), so that the upstream TypeScript reader, which places the fields
// after the name by the name's length as JavaScript counts it (UTF-16 code
// units), finds the same header and records as streamd.
func TestPublishNonASCIIFileName(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "café.ss")
	runBinaryOK(t, "one\ntwo", "publish", "--file="+path, "--key=k", "--beacon-interval=1024")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l := int(b[3])
	name := string(b[4 : 4+l])
	if name != "caf%C3%A9.ss" {
		t.Errorf("header file name %q, want caf%%C3%%A9.ss", name)
	}
	n := len(utf16.Encode([]rune(name))) // the TS reader's string length
	createdAt := binary.BigEndian.Uint64(b[4+n:])
	interval := binary.BigEndian.Uint32(b[12+n:])
	padding := 112 - n
	h, err := streamfile.ReadHeader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if createdAt != h.CreatedAtMs || interval != 1024 || 16+n+padding != streamfile.HeaderSize || b[streamfile.HeaderSize-1] != 0x0d {
		t.Errorf("the TS reader's header: created_at %d (streamd %d), interval %d, ends at %d; want the same as streamd's, ending at 128",
			createdAt, h.CreatedAtMs, interval, 16+n+padding)
	}
	if got := keyPayloads(t, path, "k"); !slices.Equal(got, []string{"one", "two"}) {
		t.Errorf("records %q, want one two", got)
	}
}

// TestPublishShortFile: publish onto a file shorter than a header (the
// start of one, as a writer that died creating it leaves) writes the
// header anew before any record, and says so.
func TestPublishShortFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "short.ss")
	runBinaryOK(t, "x", "publish", "--file="+path, "--key=k")
	if err := os.Truncate(path, 40); err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, []byte("a\nb\n"), "publish", "--file="+path, "--key=k")
	if r.code != exitOK || !strings.Contains(r.stderr, "incomplete header") {
		t.Fatalf("exit %d, stderr %q; want exit 0 and the new header said", r.code, r.stderr)
	}
	if got := keyPayloads(t, path, "k"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("records %q, want a b", got)
	}
}

// TestRepairTornTail: repair leaves a torn last frame to the next append,
// and says where it will write, rather than that the records reach the
// end.
func TestRepairTornTail(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "torn.ss")
	frame := func(p string) streamfile.Frame {
		return streamfile.Frame{Key: "k", Seq: 1, TimestampMs: 1700000000000, Payload: []byte(p)}
	}
	writeFrames(t, path, frame("a"), frame("b"), frame("c"))
	if err := os.Truncate(path, 225); err != nil { // 5 bytes short of the last frame's end
		t.Fatal(err)
	}
	r := runBinary(t, nil, "repair", path)
	if want := "nothing to repair: the next append writes at offset 196, over the 29 bytes after it"; r.code != exitOK || !strings.Contains(r.stdout, want) {
		t.Fatalf("repair: exit %d, stdout %q, stderr %q; want exit 0 saying %q", r.code, r.stdout, r.stderr, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 225 {
		t.Fatalf("repair changed the file: %v, %v", fi.Size(), err)
	}
}

// TestPublishEmptyInput: publish of no line creates a missing file, its
// header alone, which decode reads as a file without records; an existing
// file is left as it is.
func TestPublishEmptyInput(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "empty.ss")
	publishNothing := func() {
		t.Helper()
		if r := runBinary(t, nil, "publish", "--file="+path, "--key=k"); r.code != exitOK {
			t.Fatalf("publish of nothing: exit %d: %s", r.code, r.stderr)
		}
	}
	publishNothing()
	if fi, err := os.Stat(path); err != nil || fi.Size() != streamfile.HeaderSize {
		t.Fatalf("after publishing nothing: %v, %v; want a file of its header alone", fi, err)
	}
	if r := runBinary(t, nil, "decode", path); r.code != exitOK || !strings.HasPrefix(r.stdout, "# header:") || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("decode: exit %d, %q; want the header line alone", r.code, r.stdout)
	}
	runBinaryOK(t, "a\n", "publish", "--file="+path, "--key=k")
	before, _ := os.ReadFile(path)
	publishNothing()
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("publishing nothing changed an existing file")
	}
}
