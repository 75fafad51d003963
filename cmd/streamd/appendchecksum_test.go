package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/streamfile"
)

// crcUpdate continues CRC-16/CDMA2000 (polynomial 0xC867, not reflected)
// from state r over b, bit by bit: the running checksum's rule (spec §6.4),
// written apart from the writer's table-driven one.
func crcUpdate(r uint16, b ...byte) uint16 {
	for _, c := range b {
		r ^= uint16(c) << 8
		for range 8 {
			if r&0x8000 != 0 {
				r = r<<1 ^ 0xC867
			} else {
				r <<= 1
			}
		}
	}
	return r
}

// beaconMarker is one marker of a beacon, with the beacon's offset.
type beaconMarker struct {
	at int64
	m  streamfile.Marker
}

// scanFile decodes the stream file b: its frames and the markers of every
// beacon passed.
func scanFile(t *testing.T, b []byte) (frames []streamfile.Record, markers []beaconMarker) {
	t.Helper()
	r := bytes.NewReader(b)
	h, err := streamfile.ReadHeader(r)
	if err != nil {
		t.Fatal(err)
	}
	d := streamfile.NewDecoder(r, h, streamfile.HeaderSize)
	d.OnBeacon(func(at int64, bc *streamfile.Beacon) {
		for _, m := range bc.Markers {
			markers = append(markers, beaconMarker{at, m})
		}
	})
	for {
		rec, err := d.Next()
		if err != nil {
			return frames, markers
		}
		frames = append(frames, *rec)
	}
}

// TestPublishContinuesRunningChecksum: publish onto consumer.ss, written
// by the upstream writer (key hello, shard 1, seq 0–99, an end-of-stream
// frame last), writes what the upstream writer's append would (spec §10):
// the end-of-stream frame overwritten, sequences from 100, and the running
// checksum of the key that starts the run seeded with the payload checksum
// of its last frame, so that every marker after the append is that seed
// continued over the new frames begun before the beacon.
func TestPublishContinuesRunningChecksum(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(filepath.Join(vectorDir, "consumer.ss"))
	if err != nil {
		t.Fatal(err)
	}
	origFrames, origMarkers := scanFile(t, orig)
	// The rule, checked on the upstream writer's own beacons first.
	running := uint16(0xFFFF)
	for _, bm := range origMarkers {
		running = 0xFFFF
		for _, f := range origFrames {
			if f.Offset < bm.at && !f.IsEOS() {
				running = crcUpdate(running, byte(f.Checksum>>8), byte(f.Checksum))
			}
		}
		if bm.m.RunningChecksum != running {
			t.Fatalf("consumer.ss beacon at %d: running checksum %d, the rule gives %d", bm.at, bm.m.RunningChecksum, running)
		}
	}
	eos := origFrames[len(origFrames)-1]
	last := origFrames[len(origFrames)-2]
	if !eos.IsEOS() || last.Seq != 99 || last.Shard != 1 {
		t.Fatalf("consumer.ss ends with %+v, %+v; want hello/1 seq 99 and the end of stream", last.Frame, eos.Frame)
	}

	path := filepath.Join(t.TempDir(), "consumer.ss")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range 60 {
		fmt.Fprintf(&in, "[hello | 0 | 1] appended-%d\n", i)
	}
	runBinaryOK(t, strings.TrimSuffix(in.String(), "\n"), "publish", "--file="+path)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:eos.Offset], orig[:eos.Offset]) {
		t.Fatal("the bytes before the end-of-stream frame changed")
	}
	frames, markers := scanFile(t, got)
	added := frames[len(origFrames)-1:]
	if len(added) != 60 || added[0].Offset != eos.Offset || added[0].Seq != 100 || added[59].Seq != 159 {
		t.Fatalf("%d frames appended, the first at %d seq %d; want 60 from the end-of-stream frame's offset %d, seq 100–159",
			len(added), added[0].Offset, added[0].Seq, eos.Offset)
	}
	checked := 0
	for _, bm := range markers {
		if bm.at < eos.Offset {
			continue
		}
		running, seq := last.Checksum, last.Seq
		for _, f := range added {
			if f.Offset < bm.at {
				running, seq = crcUpdate(running, byte(f.Checksum>>8), byte(f.Checksum)), f.Seq
			}
		}
		if bm.m.Key != "hello" || bm.m.Shard != 1 || bm.m.Seq != seq || bm.m.RunningChecksum != running {
			t.Errorf("beacon at %d: marker %+v; want hello/1 seq %d running checksum %d", bm.at, bm.m, seq, running)
		}
		checked++
	}
	if checked < 2 {
		t.Fatalf("%d markers after the append, want at least 2", checked)
	}
}
