package retrytimer

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
)

// FuzzLoadSpool loads arbitrary bytes as the contents of a spool file, with
// the scanner Open uses. It must never panic; it either reports a corruption
// at an offset within the input, or finds a consistent set of pending copies:
// each reads back from its record and re-encodes to the same bytes, and the
// intact part loads the same on its own and when rewritten from the copies.
// The input stays in memory: writing a file per input made the fuzzer wait
// on the disk. TestSpoolTornTail and TestSpoolCorruption cover the file
// side (truncation, error messages naming the file).
func FuzzLoadSpool(f *testing.F) {
	due := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	sched := func(id uint64, c Copy) []byte {
		rec, err := encodeSchedule(id, due+int64(id), int64(id)*int64(time.Second), &c)
		if err != nil {
			f.Fatal(err)
		}
		return rec
	}
	// Type 1 and type 3 records, written before copies reached the queue in
	// their final form.
	v1 := encodeLegacy(recScheduleV1, 4, due, 0, "", "old", legacyFields{payload: []byte("v1")})
	v3 := encodeLegacy(recScheduleV3, 5, due, int64(time.Second), "orders", "old",
		legacyFields{envelope.Headers{{Name: "x-ruststream-retry-count", Value: []byte("1")}}, []byte(`{"id":7}`)})
	a := sched(1, Copy{Stream: "orders", Key: "orders", Record: []byte(`rs1:AAAAAB`)})
	b := sched(2, Copy{Key: "k"})
	c := sched(3, Copy{Record: []byte{0, 1}})
	magic := []byte(fileMagic)
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add([]byte(nil))
	f.Add(magic)
	f.Add(cat(magic, a))
	f.Add(cat(magic, a, b, encodeDone(1), c))
	f.Add(cat(magic, a, b, encodeDone(2), c[:len(c)-3]))
	f.Add(cat(magic, a, encodeDone(1), encodeDone(1)))
	f.Add(cat(magic, a, make([]byte, 40)))
	f.Add(cat(magic, raw(9), b))
	f.Add(cat(magic, a, v1, encodeDone(4), b))
	f.Add(cat(magic, v3, a, v1, encodeDone(1)))

	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := scanBytes(data)
		if err != nil {
			var ce *corruptError
			if !errors.As(err, &ce) || ce.off < 0 || ce.off > int64(len(data)) {
				t.Fatalf("scan error %v, want a corruption at an offset in the file", err)
			}
			return
		}
		if res.end < int64(len(fileMagic)) || res.end > int64(len(data)) {
			t.Fatalf("intact part ends at %d of %d bytes", res.end, len(data))
		}
		intact := data[:res.end]
		var live int64
		rebuilt := []byte(fileMagic)
		for i, e := range res.entries {
			if i > 0 && e.id <= res.entries[i-1].id {
				t.Fatalf("entries not in id order: %d after %d", e.id, res.entries[i-1].id)
			}
			if e.id >= res.nextID {
				t.Fatalf("next id %d, but %d is pending", res.nextID, e.id)
			}
			if e.off < int64(len(fileMagic)) || e.off+e.recordSize() > res.end {
				t.Fatalf("entry %d at %d+%d, outside the intact part (%d bytes)", e.id, e.off, e.recordSize(), res.end)
			}
			rec := intact[e.off : e.off+e.recordSize()]
			b, err := decodeBody(rec[hdrSize:])
			if err != nil || !b.isSchedule() || b.id != e.id || b.due != e.due || b.delay != e.delay ||
				(b.typ == recScheduleV1) == (e.delay >= 0) {
				t.Fatalf("entry %+v reads back as %+v, %v", e, b, err)
			}
			live += e.recordSize()
			re := reencode(t, b)
			if !bytes.Equal(re, rec) {
				t.Fatalf("entry %d re-encodes differently", e.id)
			}
			rebuilt = append(rebuilt, re...)
		}
		if live != res.live {
			t.Fatalf("live bytes %d, entries add up to %d", res.live, live)
		}
		for name, d := range map[string][]byte{"intact part": intact, "rebuilt": rebuilt} {
			again, err := scanBytes(d)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if again.end != int64(len(d)) {
				t.Fatalf("%s: intact part ends at %d of %d", name, again.end, len(d))
			}
			if !slices.EqualFunc(again.entries, res.entries, func(x, y entry) bool { return x.id == y.id && x.due == y.due && x.delay == y.delay }) {
				t.Fatalf("%s: entries %v, want %v", name, again.entries, res.entries)
			}
		}
	})
}

// FuzzDecodeBody decodes arbitrary bytes as a record body, which FuzzLoadSpool
// rarely reaches behind a valid checksum. A body that decodes must encode
// back to the same bytes, and a schedule record must yield its copy: the
// record of type 4 as it is, that of types 1 and 3 enveloped from their
// headers and payload.
func FuzzDecodeBody(f *testing.F) {
	rec, err := encodeSchedule(1, 2, 3, &Copy{Stream: "s", Key: "k", Record: []byte("rs1:AAAAAA"), Subscription: "billing"})
	if err != nil {
		f.Fatal(err)
	}
	old := legacyFields{envelope.Headers{{Name: "a", Value: []byte("1")}, {Name: "b"}}, []byte("p")}
	f.Add(rec[hdrSize:])
	f.Add(encodeLegacy(recScheduleV1, 1, 2, 0, "s", "k", old)[hdrSize:])
	f.Add(encodeLegacy(recScheduleV3, 1, 2, 3, "s", "k", old)[hdrSize:])
	f.Add(encodeLegacy(recScheduleV3, 1, 2, 3, "", "", legacyFields{envelope.Headers{{Name: "\xff"}}, nil})[hdrSize:])
	f.Add(encodeDone(3)[hdrSize:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decodeBody(data)
		if err != nil {
			return
		}
		if re := reencode(t, b); !bytes.Equal(re[hdrSize:], data) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", data, b, re[hdrSize:])
		}
		if !b.isSchedule() {
			return
		}
		c := b.copy()
		want := b.c.Record
		if b.typ != recSchedule {
			want = envelope.Encode(b.legacy.headers, b.legacy.payload, false)
		}
		if c.Stream != b.c.Stream || c.Key != b.c.Key || !bytes.Equal(c.Record, want) {
			t.Fatalf("%x decodes to %+v, whose copy is %+v", data, b, c)
		}
	})
}

// reencode returns the complete record that b was decoded from.
func reencode(t *testing.T, b body) []byte {
	t.Helper()
	switch b.typ {
	case recSchedule:
		re, err := encodeSchedule(b.id, b.due, b.delay, &b.c)
		if err != nil {
			t.Fatal(err)
		}
		return re
	case recScheduleV1, recScheduleV3:
		return encodeLegacy(b.typ, b.id, b.due, b.delay, b.c.Stream, b.c.Key, b.legacy)
	case recDone:
		return encodeDone(b.id)
	}
	t.Fatalf("decoded a record of type %d", b.typ)
	return nil
}

func scanBytes(data []byte) (scanResult, error) {
	return scan(bytes.NewReader(data), int64(len(data)), nil)
}
