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
