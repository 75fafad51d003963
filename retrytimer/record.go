package retrytimer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// fileMagic opens every spool file; its last byte is the format version.
const fileMagic = "SDRETRY1"

// hdrSize is the size of a record header: body length, checksum of the
// length, checksum of the body (each a little-endian u32).
const hdrSize = 12

// maxBody is the largest record body the u32 length field can describe.
const maxBody = math.MaxUint32

// Record types, the first byte of a body. Types 1 and 3 are read, never
// written (see legacy.go).
const (
	recScheduleV1 byte = 1 // a schedule record without the delay, headers and payload apart
	recDone       byte = 2
	recScheduleV3 byte = 3 // a schedule record with the delay, headers and payload apart
	recSchedule   byte = 4 // a schedule record with the delay and the copy's record
)

// unknownDelay is the delay of a copy scheduled by a type 1 record.
const unknownDelay = -1

// doneBodySize is the size of a done record body: type and id.
const doneBodySize = 1 + 8

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	le         = binary.LittleEndian
)

// errTruncatedField and errTrailingBytes describe a body that does not parse.
var (
	errTruncatedField = errors.New("truncated field")
	errTrailingBytes  = errors.New("trailing bytes")
)

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// encodeSchedule returns the complete record (header and body) that schedules
// c under id for due (Unix nanoseconds), delay (nanoseconds, not negative)
// after the time it was scheduled. The record shares no memory with c.
func encodeSchedule(id uint64, due, delay int64, c *Copy) ([]byte, error) {
	n := 1 + 8 + 8 + 8 + 4 + len(c.Stream) + 4 + len(c.Key) + 4 + len(c.Record) + 4 + len(c.Subscription)
	if n > maxBody {
		return nil, fmt.Errorf("copy of %d bytes is too large for a spool record", n)
	}
	rec := make([]byte, hdrSize, hdrSize+n)
	rec = append(rec, recSchedule)
	rec = le.AppendUint64(rec, id)
	rec = le.AppendUint64(rec, uint64(due))
	rec = le.AppendUint64(rec, uint64(delay))
	rec = appendBytes(rec, c.Stream)
	rec = appendBytes(rec, c.Key)
	rec = appendBytes(rec, c.Record)
	rec = appendBytes(rec, c.Subscription)
	seal(rec)
	return rec, nil
}

// encodeDone returns the complete record that marks id as fired.
func encodeDone(id uint64) []byte {
	rec := make([]byte, hdrSize, hdrSize+doneBodySize)
	rec = append(rec, recDone)
	rec = le.AppendUint64(rec, id)
	seal(rec)
	return rec
}

func appendBytes[T string | []byte](dst []byte, b T) []byte {
	dst = le.AppendUint32(dst, uint32(len(b)))
	return append(dst, b...)
}

// seal fills in the header of rec, whose body follows the header.
func seal(rec []byte) {
	le.PutUint32(rec[0:4], uint32(len(rec)-hdrSize))
	le.PutUint32(rec[4:8], checksum(rec[0:4]))
	le.PutUint32(rec[8:12], checksum(rec[hdrSize:]))
}

// header is a parsed record header.
type header struct {
	n       uint32 // body length
	lenOK   bool   // the length's checksum matches
	bodyCRC uint32
}

func parseHeader(h []byte) header {
	return header{
		n:       le.Uint32(h[0:4]),
		lenOK:   checksum(h[0:4]) == le.Uint32(h[4:8]),
		bodyCRC: le.Uint32(h[8:12]),
	}
}

// body is a decoded record body.
type body struct {
	typ    byte
	id     uint64
	due    int64        // schedule records only
	delay  int64        // schedule records only; unknownDelay in type 1
	c      Copy         // schedule records only; no Record in types 1 and 3
	legacy legacyFields // types 1 and 3 only
}

// isSchedule reports whether the record schedules a copy.
func (b *body) isSchedule() bool {
	return b.typ == recSchedule || b.typ == recScheduleV3 || b.typ == recScheduleV1
}

// copy returns the copy a schedule record schedules; that of a type 1 or 3
// record gets its record from the headers and payload held apart.
func (b *body) copy() Copy {
	c := b.c
	if b.typ != recSchedule {
		c.Record = b.legacy.record()
	}
	return c
}

// decodeBody parses a record body. The copy's record (or, in types 1 and 3,
// its payload and header values) aliases b; its strings do not.
func decodeBody(b []byte) (body, error) {
	if len(b) == 0 {
		return body{}, errors.New("empty record")
	}
	d := decoder{b: b[1:]}
	r := body{typ: b[0], id: d.u64()}
	switch r.typ {
	case recDone:
	case recSchedule, recScheduleV3, recScheduleV1:
		r.due = int64(d.u64())
		r.delay = unknownDelay
		if r.typ != recScheduleV1 {
			if r.delay = int64(d.u64()); r.delay < 0 {
				return body{}, errors.New("negative delay")
			}
		}
		r.c.Stream = string(d.bytes())
		r.c.Key = string(d.bytes())
		if r.typ == recSchedule {
			r.c.Record = d.bytes()
			r.c.Subscription = string(d.bytes())
		} else {
			r.legacy = d.legacyFields()
		}
	default:
		return body{}, fmt.Errorf("unknown record type %d", r.typ)
	}
	if d.short {
		return body{}, errTruncatedField
	}
	if len(d.b) != 0 {
		return body{}, errTrailingBytes
	}
	return r, nil
}

// decoder reads fixed-width fields; after the first short read every field
// reads as zero and short stays set.
type decoder struct {
	b     []byte
	short bool
}

func (d *decoder) take(n uint64) []byte {
	if d.short || uint64(len(d.b)) < n {
		d.short = true
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return le.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return le.Uint64(v)
	}
	return 0
}

// bytes reads a length-prefixed field; an empty field reads as nil.
func (d *decoder) bytes() []byte {
	n := d.u32()
	if n == 0 {
		return nil
	}
	return d.take(uint64(n))
}
