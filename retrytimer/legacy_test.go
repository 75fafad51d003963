package retrytimer

import (
	"bytes"
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
)

// encodeLegacy returns a complete schedule record of type typ (1 or 3) as
// earlier versions wrote it: the copy's stream and key, then its headers and
// payload apart. A type 1 record has no delay.
func encodeLegacy(typ byte, id uint64, due, delay int64, stream, key string, l legacyFields) []byte {
	rec := make([]byte, hdrSize)
	rec = append(rec, typ)
	rec = le.AppendUint64(rec, id)
	rec = le.AppendUint64(rec, uint64(due))
	if typ == recScheduleV3 {
		rec = le.AppendUint64(rec, uint64(delay))
	}
	rec = appendBytes(rec, stream)
	rec = appendBytes(rec, key)
	rec = le.AppendUint32(rec, uint32(len(l.headers)))
	for _, h := range l.headers {
		rec = appendBytes(rec, h.Name)
		rec = appendBytes(rec, h.Value)
	}
	rec = appendBytes(rec, l.payload)
	seal(rec)
	return rec
}

// TestSpoolLegacyRecords opens a spool written before copies reached the
// queue in their final form: type 1 and type 3 records holding headers and
// payload apart, next to a type 4 record. Each old copy fires the record an
// earlier streamd wrote for it, envelope.Encode(headers, payload, false),
// byte for byte; the new copy fires its record as it is. The old records
// survive a compaction and a reopening unchanged.
func TestSpoolLegacyRecords(t *testing.T) {
	past := time.Now().Add(-time.Minute).UnixNano()
	retry := envelope.Headers{{Name: envelope.RetryCountHeader, Value: []byte("2")}, {Name: "x-producer", Value: []byte("billing")}}
	binary := envelope.Headers{{Name: "x-bin", Value: []byte{0xff, 0, '\n'}}}
	type old struct {
		typ    byte
		key    string
		fields legacyFields
	}
	olds := []old{
		{recScheduleV1, "v1-headers", legacyFields{retry, []byte(`{"id":1}`)}},
		{recScheduleV3, "v3-headers", legacyFields{binary, []byte("line one\nline two")}},
		{recScheduleV3, "v3-bare", legacyFields{nil, []byte("plain")}},
		{recScheduleV1, "v1-prefixed", legacyFields{nil, []byte("rs1:not an envelope")}},
		{recScheduleV3, "v3-empty", legacyFields{retry, nil}},
	}
	want := map[string][]byte{}
	data := []byte(fileMagic)
	for i, o := range olds {
		data = append(data, encodeLegacy(o.typ, uint64(i+1), past+int64(i), int64(time.Second), "orders", o.key, o.fields)...)
		want[o.key] = envelope.Encode(o.fields.headers, o.fields.payload, false)
	}
	if bytes.Equal(want["v1-headers"], olds[0].fields.payload) || bytes.Equal(want["v1-prefixed"], olds[3].fields.payload) {
		t.Fatal("the test's copies would fire the same bytes enveloped or not")
	}
	newCopy := Copy{Stream: "orders", Key: "new", Record: envelope.Encode(retry, []byte("new"), false)}
	want["new"] = newCopy.Record
	rec, err := encodeSchedule(uint64(len(olds)+1), past+int64(len(olds)), int64(time.Second), &newCopy)
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, rec...)
	pending := bytes.Clone(data)
	// A fired copy, larger than the pending ones, for compaction to drop.
	data = append(data, encodeLegacy(recScheduleV3, 99, past, 0, "orders", "fired", legacyFields{retry, make([]byte, 4096)})...)
	data = append(data, encodeDone(99)...)
	dir, path := writeSpool(t, data)

	// Opening and compacting fire nothing and keep the pending records as
	// they were.
	q := mustOpen(t, Options{Dir: dir, CompactMinBytes: 1, Fire: func(context.Context, Copy) error {
		t.Error("a copy fired while the spool was compacted")
		return nil
	}})
	if n := q.Pending(); n != len(want) {
		t.Fatalf("pending %d, want %d", n, len(want))
	}
	q.maybeCompact()
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, pending) {
		t.Fatalf("spool after compaction differs from its pending records (err %v)", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	got := map[string][]byte{}
	var order []string
	q = mustOpen(t, Options{Dir: dir, Fire: func(_ context.Context, c Copy) error {
		mu.Lock()
		defer mu.Unlock()
		if c.Stream != "orders" {
			t.Errorf("copy %q fired to stream %q", c.Key, c.Stream)
		}
		got[c.Key] = c.Record
		order = append(order, c.Key)
		return nil
	}})
	if _, err := q.Drain(t.Context()); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for key, w := range want {
		if !bytes.Equal(got[key], w) {
			t.Errorf("copy %q fired %q, want %q", key, got[key], w)
		}
	}
	if wantOrder := []string{"v1-headers", "v3-headers", "v3-bare", "v1-prefixed", "v3-empty", "new"}; !slices.Equal(order, wantOrder) {
		t.Errorf("fired %v, want %v", order, wantOrder)
	}
}
