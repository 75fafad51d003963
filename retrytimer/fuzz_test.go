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
	// A type 1 record, written before schedule records kept the delay.
	v1, err := encodeScheduleType(recScheduleV1, 4, due, 0, &Copy{Key: "old", Payload: []byte("v1")})
	if err != nil {
		f.Fatal(err)
	}
	a := sched(1, Copy{Stream: "orders", Key: "orders", Payload: []byte(`{"id":7}`),
		Headers: envelope.Headers{{Name: "x-ruststream-retry-count", Value: []byte("1")}}})
	b := sched(2, Copy{Key: "k"})
	c := sched(3, Copy{Headers: envelope.Headers{{Name: "", Value: nil}, {Name: "n", Value: []byte{0, 1}}}})
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
				(b.typ == recSchedule) != (e.delay >= 0) {
				t.Fatalf("entry %+v reads back as %+v, %v", e, b, err)
			}
			live += e.recordSize()
			re, err := encodeScheduleType(b.typ, b.id, b.due, b.delay, &b.c)
			if err != nil {
				t.Fatal(err)
			}
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
// back to the same bytes.
func FuzzDecodeBody(f *testing.F) {
	c := &Copy{Stream: "s", Key: "k", Payload: []byte("p"),
		Headers: envelope.Headers{{Name: "a", Value: []byte("1")}, {Name: "b"}}}
	rec, err := encodeSchedule(1, 2, 3, c)
	if err != nil {
		f.Fatal(err)
	}
	v1, err := encodeScheduleType(recScheduleV1, 1, 2, 0, c)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec[hdrSize:])
	f.Add(v1[hdrSize:])
	f.Add(encodeDone(3)[hdrSize:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decodeBody(data)
		if err != nil {
			return
		}
		var re []byte
		switch b.typ {
		case recSchedule, recScheduleV1:
			if re, err = encodeScheduleType(b.typ, b.id, b.due, b.delay, &b.c); err != nil {
				t.Fatal(err)
			}
		case recDone:
			re = encodeDone(b.id)
		default:
			t.Fatalf("decoded a record of type %d", b.typ)
		}
		if !bytes.Equal(re[hdrSize:], data) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", data, b, re[hdrSize:])
		}
	})
}

func scanBytes(data []byte) (scanResult, error) {
	return scan(bytes.NewReader(data), int64(len(data)))
}
