package streamfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestDecoderContinuesAcrossAppends starts from edge-b-truncated.ss, appends
// the rest of edge-a-spliced.ss in pieces cut at random points (inside
// frames, fields and beacons), and checks that a decoder kept across the
// appends yields exactly edge-a's frames.
func TestDecoderContinuesAcrossAppends(t *testing.T) {
	full, err := os.ReadFile(filepath.Join(vectorDir, "edge-a-spliced.ss"))
	if err != nil {
		t.Fatal(err)
	}
	torn, err := os.ReadFile(filepath.Join(vectorDir, "edge-b-truncated.ss"))
	if err != nil {
		t.Fatal(err)
	}
	want := loadExpected(t, "edge-a-spliced").frames(t)
	rounds := 300
	if testing.Short() {
		rounds = 30
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range rounds {
		path := filepath.Join(t.TempDir(), "live.ss")
		if err := os.WriteFile(path, torn, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		h, err := ReadHeader(f)
		if err != nil {
			t.Fatal(err)
		}
		d := NewDecoder(f, h, HeaderSize)
		d.ReadSize = 1 + rng.IntN(512)
		var got []Frame
		drain := func() {
			for {
				r, err := d.Next()
				if errors.Is(err, io.EOF) || errors.Is(err, ErrTruncated) {
					return
				}
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				fr := r.Frame
				fr.Payload = append([]byte(nil), r.Payload...)
				got = append(got, fr)
			}
		}
		drain()
		rest := full[len(torn):]
		for len(rest) > 0 {
			n := 1 + rng.IntN(min(len(rest), 600))
			if _, err := f.Write(rest[:n]); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
			drain()
		}
		f.Close()
		if err := sameFrames(got, want); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// sameFrames reports the first difference between two frame lists.
func sameFrames(got, want []Frame) error {
	if len(got) != len(want) {
		return fmt.Errorf("got %d frames, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Key != w.Key || g.Shard != w.Shard || g.Seq != w.Seq || g.TimestampMs != w.TimestampMs || !bytes.Equal(g.Payload, w.Payload) {
			return fmt.Errorf("frame %d: got %s/%d seq %d, want %s/%d seq %d", i, g.Key, g.Shard, g.Seq, w.Key, w.Shard, w.Seq)
		}
	}
	return nil
}

// TestDecoderRereadsRepairedTornTail stops a decoder at a torn tail, then
// has a writer repair it (truncate the torn bytes, write other frames in
// their place): the decoder yields the new frames, never the old bytes
// combined with the new ones.
func TestDecoderRereadsRepairedTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torn.ss")
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "torn.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	first := Frame{Key: "k", Seq: 1, TimestampMs: 1, Payload: bytes.Repeat([]byte("a"), 100)}
	if err := w.Append(first); err != nil {
		t.Fatal(err)
	}
	w.Close()
	end, _ := os.Stat(path)
	// The head and 20 payload bytes of a frame that will never be finished.
	torn := Frame{Key: "k", Seq: 2, TimestampMs: 2, Payload: bytes.Repeat([]byte("b"), 100)}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(append(appendFrameHead(nil, &torn), torn.Payload[:20]...))
	f.Close()

	r, _ := os.Open(path)
	defer r.Close()
	h, _ := ReadHeader(r)
	d := NewDecoder(r, h, HeaderSize)
	if rec, err := d.Next(); err != nil || rec.Seq != 1 {
		t.Fatalf("Next = %v, %v; want seq 1", rec, err)
	}
	if _, err := d.Next(); !errors.Is(err, ErrTruncated) {
		t.Fatalf("Next at the torn tail = %v, want ErrTruncated", err)
	}
	if d.Pos() != end.Size() {
		t.Fatalf("position %d at the torn tail, want %d", d.Pos(), end.Size())
	}

	// The repair: OpenWriter truncates the torn bytes; other frames follow.
	w, err = OpenWriter(path, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	repaired := []Frame{
		{Key: "k", Seq: 2, TimestampMs: 3, Payload: []byte("short")},
		{Key: "k", Seq: 3, TimestampMs: 4, Payload: bytes.Repeat([]byte("c"), 300)},
	}
	if err := w.Append(repaired...); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var got []Frame
	for {
		rec, err := d.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after the repair: %v", err)
		}
		fr := rec.Frame
		fr.Payload = bytes.Clone(fr.Payload)
		got = append(got, fr)
	}
	if err := sameFrames(got, repaired); err != nil {
		t.Fatal(err)
	}
}
