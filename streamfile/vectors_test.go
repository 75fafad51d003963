package streamfile

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

const vectorDir = "../testdata/streamfile"

var vectorNames = []string{"sample-1", "consumer", "quicksort", "edge-a-spliced", "edge-b-truncated", "edge-c-badcrc", "edge-d-eos"}

// expected is the parsed content of a NAME.expected.ndjson file.
type expected struct {
	header  Header
	entries []entry // messages, beacons and the terminal error, by offset
}

// entry is one line of an expected file.
type entry struct {
	Offset      int64  `json:"offset"`
	StreamKey   string `json:"stream_key"`
	ShardID     uint64 `json:"shard_id"`
	Seq         uint64 `json:"seq"`
	TimestampMs uint64 `json:"timestamp_ms"`
	PayloadB64  string `json:"payload_b64"`
	Checksum    uint16 `json:"checksum"`

	BeaconAt  *int64 `json:"beacon_at"`
	Remaining uint32 `json:"remaining"`
	Items     []struct {
		StreamKey       string `json:"stream_key"`
		ShardID         uint64 `json:"shard_id"`
		Seq             uint64 `json:"seq"`
		TimestampMs     uint64 `json:"timestamp_ms"`
		RunningChecksum uint16 `json:"running_checksum"`
	} `json:"items"`

	Error    string `json:"error"`
	FileSize int64  `json:"file_size"`
	Received uint16 `json:"received"`
	Computed uint16 `json:"computed"`
}

func (e *entry) frame(t testing.TB) Frame {
	p, err := base64.StdEncoding.DecodeString(e.PayloadB64)
	if err != nil {
		t.Fatal(err)
	}
	return Frame{Key: e.StreamKey, Shard: e.ShardID, Seq: e.Seq, TimestampMs: e.TimestampMs, Payload: p}
}

func loadExpected(t testing.TB, name string) expected {
	t.Helper()
	f, err := os.Open(filepath.Join(vectorDir, name+".expected.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var exp expected
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for i := 0; sc.Scan(); i++ {
		if i == 0 {
			var h struct {
				FileName       string `json:"file_name"`
				CreatedAtMs    uint64 `json:"created_at_ms"`
				BeaconInterval uint32 `json:"beacon_interval"`
			}
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
				t.Fatal(err)
			}
			exp.header = Header{h.FileName, h.CreatedAtMs, h.BeaconInterval}
			continue
		}
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		exp.entries = append(exp.entries, e)
	}
	return exp
}

func (x expected) frames(t testing.TB) []Frame {
	var out []Frame
	for i := range x.entries {
		if e := &x.entries[i]; e.BeaconAt == nil && e.Error == "" {
			out = append(out, e.frame(t))
		}
	}
	return out
}

// decodeAll reads a whole file the way `streamd decode` does and returns
// its entries in the expected file's order.
func decodeAll(t testing.TB, file []byte) (Header, []entry) {
	t.Helper()
	r, size := bytes.NewReader(file), int64(len(file))
	h, err := ReadHeader(r)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDecoder(r, h, HeaderSize)
	var out, beacons []entry
	d.OnBeacon(func(at int64, b *Beacon) {
		e := entry{BeaconAt: &at, Remaining: b.Remaining}
		for _, m := range b.Markers {
			e.Items = append(e.Items, struct {
				StreamKey       string `json:"stream_key"`
				ShardID         uint64 `json:"shard_id"`
				Seq             uint64 `json:"seq"`
				TimestampMs     uint64 `json:"timestamp_ms"`
				RunningChecksum uint16 `json:"running_checksum"`
			}{m.Key, m.Shard, m.Seq, m.TimestampMs, m.RunningChecksum})
		}
		beacons = append(beacons, e)
	})
	flush := func(before int64) {
		for len(beacons) > 0 && *beacons[0].BeaconAt < before {
			out = append(out, beacons[0])
			beacons = beacons[1:]
		}
	}
	for {
		rec, err := d.Next()
		var ce *ChecksumError
		switch {
		case err == nil:
			flush(rec.Offset)
			out = append(out, entry{Offset: rec.Offset, StreamKey: rec.Key, ShardID: rec.Shard, Seq: rec.Seq,
				TimestampMs: rec.TimestampMs, PayloadB64: base64.StdEncoding.EncodeToString(rec.Payload), Checksum: rec.Checksum})
			continue
		case errors.Is(err, ErrEndOfStream), errors.Is(err, io.EOF):
			flush(size + 1)
		case errors.Is(err, ErrTruncated):
			flush(size + 1)
			out = append(out, entry{Error: "truncated", Offset: d.Pos(), FileSize: size})
		case errors.As(err, &ce):
			flush(size + 1)
			out = append(out, entry{Error: "checksum", Offset: ce.Offset, Received: ce.Received, Computed: ce.Computed})
		default:
			t.Fatalf("decode: %v", err)
		}
		return h, out
	}
}

// TestDecodeVectors decodes every vector and compares with its expected
// entries.
func TestDecodeVectors(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) { testDecodeVector(t, name) })
	}
}

func testDecodeVector(t *testing.T, name string) {
	b, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
	if err != nil {
		t.Fatal(err)
	}
	exp := loadExpected(t, name)
	h, got := decodeAll(t, b)
	if h != exp.header {
		t.Errorf("header = %+v, want %+v", h, exp.header)
	}
	if len(got) != len(exp.entries) {
		t.Fatalf("got %d entries, want %d", len(got), len(exp.entries))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], exp.entries[i]) {
			t.Errorf("entry %d:\n got  %+v\n want %+v", i, got[i], exp.entries[i])
		}
	}
}

// TestDecodeSmallReads decodes every vector with tiny reads, so that every
// field and beacon straddles a read boundary.
func TestDecodeSmallReads(t *testing.T) {
	for _, name := range vectorNames {
		b, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
		if err != nil {
			t.Fatal(err)
		}
		_, want := decodeAll(t, b)
		for _, rs := range []int{1, 7, 64} {
			h, _ := ReadHeader(bytes.NewReader(b))
			d := NewDecoder(bytes.NewReader(b), h, HeaderSize)
			d.ReadSize = rs
			n := 0
			for {
				_, err := d.Next()
				if err != nil {
					break
				}
				n++
			}
			if msgs := countMessages(want); n != msgs {
				t.Errorf("%s, read size %d: %d frames, want %d", name, rs, n, msgs)
			}
		}
	}
}

func countMessages(es []entry) int {
	n := 0
	for _, e := range es {
		if e.BeaconAt == nil && e.Error == "" {
			n++
		}
	}
	return n
}

func TestWriterReproducesVectors(t *testing.T) {
	for _, name := range []string{"sample-1", "consumer", "quicksort", "edge-a-spliced", "edge-d-eos"} {
		t.Run(name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
			if err != nil {
				t.Fatal(err)
			}
			exp := loadExpected(t, name)
			path := filepath.Join(t.TempDir(), "out.ss")
			w, err := OpenWriter(path, CreateOptions{Header: exp.header, Create: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Append(exp.frames(t)...); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Fatalf("written file differs from %s.ss at offset %d (got %d bytes, want %d)", name, i, len(got), len(want))
			}
		})
	}
}
