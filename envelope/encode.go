package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// The two envelope prefixes (settlement.md §9.2).
const (
	rs1Prefix = "rs1:"
	rs2Prefix = "rs2:"
)

// Encode returns the record for headers h and payload (settlement.md §9.1–9.3).
// When no envelope is needed the record is the payload, byte for byte;
// otherwise it is an rs1: or rs2: envelope. line selects the pipe transport's
// rule, under which a payload that cannot stand alone on a line (not UTF-8,
// containing '\n', or with leading or trailing white space) is enveloped even
// without headers; the stream-file transport passes false.
//
// The result never aliases payload. See [AppendEncode] for how names are
// written and when Encode panics.
func Encode(h Headers, payload []byte, line bool) []byte {
	return AppendEncode(nil, h, payload, line)
}

// AppendEncode appends the record for h and payload to dst, as [Encode]
// describes, and returns the extended slice.
//
// Headers are written in slice order and names as given, so h should be built
// with [Headers.Set], which lowercases names and keeps them unique; a decoder
// lowercases names and lets a later duplicate replace an earlier one. A name
// that is not valid UTF-8 cannot be decoded from an rs2 block, so it is
// written with each ill-formed sequence replaced by U+FFFD.
//
// AppendEncode panics if a name, a value or the whole header block is longer
// than math.MaxUint32 bytes, which the u32 length fields cannot express.
func AppendEncode(dst []byte, h Headers, payload []byte, line bool) []byte {
	if !needsEnvelope(h, payload, line) {
		return append(dst, payload...)
	}
	// head is the framed record up to the payload: the block length and the
	// block. It stays on the stack unless the headers are large.
	var buf [256]byte
	head := append(buf[:0], 0, 0, 0, 0)
	prefix := rs1Prefix
	if fitsRS1(h) {
		head = appendRS1Block(head, h)
	} else {
		prefix = rs2Prefix
		head = appendRS2Block(head, h)
	}
	binary.BigEndian.PutUint32(head, u32Len(len(head)-4))

	// Move the payload bytes that complete head's last 3-byte base64 group
	// into head, so head and the rest of the payload encode one after the
	// other as a single base64 text without copying the payload.
	n := min((3-len(head)%3)%3, len(payload))
	head = append(head, payload[:n]...)
	payload = payload[n:]

	enc := base64.StdEncoding
	dst = slices.Grow(dst, len(prefix)+enc.EncodedLen(len(head)+len(payload)))
	dst = append(dst, prefix...)
	dst = enc.AppendEncode(dst, head)
	return enc.AppendEncode(dst, payload)
}

// needsEnvelope reports whether a record must be enveloped (settlement.md
// §9.1): it has headers, the payload would be mistaken for an envelope, or,
// on a line, the payload cannot be carried as it is.
func needsEnvelope(h Headers, payload []byte, line bool) bool {
	return len(h) > 0 ||
		bytes.HasPrefix(payload, []byte(rs1Prefix)) ||
		bytes.HasPrefix(payload, []byte(rs2Prefix)) ||
		(line && !fitsLine(payload))
}

// fitsLine reports whether p can be the payload of a stdio line unchanged:
// valid UTF-8, no '\n', and nothing the reader's trimming would remove.
func fitsLine(p []byte) bool {
	return utf8.Valid(p) && bytes.IndexByte(p, '\n') < 0 && len(bytes.TrimSpace(p)) == len(p)
}

// fitsRS1 reports whether every header of h survives the rs1 form unchanged
// (settlement.md §9.2).
func fitsRS1(h Headers) bool {
	for _, e := range h {
		if strings.IndexByte(e.Name, ':') >= 0 || !rs1Safe(e.Name) || !rs1SafeBytes(e.Value) {
			return false
		}
	}
	return true
}

// rs1Safe reports whether the name or value s can stand in an rs1 line, which
// is split on '\n', loses a trailing '\r', has both halves trimmed, and is read
// as UTF-8.
func rs1Safe(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsAny(s, "\r\n") && strings.TrimSpace(s) == s
}

// rs1SafeBytes is [rs1Safe] for a value held as bytes.
func rs1SafeBytes(b []byte) bool {
	return utf8.Valid(b) && !bytes.ContainsAny(b, "\r\n") && len(bytes.TrimSpace(b)) == len(b)
}

// appendRS1Block appends the rs1 block of h: "name: value\n" per header.
func appendRS1Block(b []byte, h Headers) []byte {
	for _, e := range h {
		b = append(b, e.Name...)
		b = append(b, ": "...)
		b = append(b, e.Value...)
		b = append(b, '\n')
	}
	return b
}

// appendRS2Block appends the rs2 block of h: per header, a big-endian u32
// name length, the name, a big-endian u32 value length and the value.
func appendRS2Block(b []byte, h Headers) []byte {
	for _, e := range h {
		at := len(b)
		b = appendLossy(append(b, 0, 0, 0, 0), e.Name)
		binary.BigEndian.PutUint32(b[at:], u32Len(len(b)-at-4))
		b = binary.BigEndian.AppendUint32(b, u32Len(len(e.Value)))
		b = append(b, e.Value...)
	}
	return b
}

// u32Len returns the length n as a u32 length field. It panics if n does not
// fit, because the record could not be decoded.
func u32Len(n int) uint32 {
	if uint64(n) > math.MaxUint32 {
		panic(fmt.Sprintf("envelope: %d bytes do not fit a u32 length field", n))
	}
	return uint32(n)
}
