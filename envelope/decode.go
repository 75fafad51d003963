package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"unicode/utf8"
)

// strictBase64 is the envelope's base64 (settlement.md §9.4): standard
// alphabet, '=' padding required, and unused trailing bits zero.
var strictBase64 = base64.StdEncoding.Strict()

// Decode splits record into its envelope headers and payload (settlement.md
// §9.4). A record that is not a well-formed rs1: or rs2: envelope is plain:
// Decode then returns nil headers and record itself as the payload. An
// envelope without headers also returns nil headers.
//
// Names are lowercased and unique; for a repeated name the last value wins,
// kept at the name's first position. The payload and the header values of an
// envelope share one newly allocated buffer, never record. Each value's
// capacity ends at its length, so appending to one cannot overwrite another.
func Decode(record []byte) (Headers, []byte) {
	h, payload, ok := decode(record)
	if !ok {
		return nil, record
	}
	return h, payload
}

// decode decodes an envelope, reporting false when record is plain.
func decode(record []byte) (Headers, []byte, bool) {
	var parseBlock func([]byte) (Headers, bool)
	switch {
	case bytes.HasPrefix(record, []byte(rs1Prefix)):
		parseBlock = parseRS1
	case bytes.HasPrefix(record, []byte(rs2Prefix)):
		parseBlock = parseRS2
	default:
		return nil, nil, false
	}
	text := record[len(rs1Prefix):]
	// Go's base64 decoder skips '\r' and '\n'; the envelope forbids them.
	// Every other byte outside the base64 alphabet fails to decode, so a
	// record that gets past here is ASCII and thus valid UTF-8, as §9.4
	// step 1 requires.
	if bytes.ContainsAny(text, "\r\n") {
		return nil, nil, false
	}
	framed := make([]byte, strictBase64.DecodedLen(len(text)))
	n, err := strictBase64.Decode(framed, text)
	if err != nil || n < 4 {
		return nil, nil, false
	}
	framed = framed[:n]
	size := binary.BigEndian.Uint32(framed)
	if uint64(size) > uint64(n-4) {
		return nil, nil, false
	}
	end := 4 + int(size)
	h, ok := parseBlock(framed[4:end:end])
	if !ok {
		return nil, nil, false
	}
	return h, framed[end:], true
}

// parseRS1 parses an rs1 block: UTF-8 text, invalid bytes replaced, one
// header per line that contains ':'. It never fails.
func parseRS1(block []byte) (Headers, bool) {
	if !utf8.Valid(block) {
		block = appendLossy(nil, block)
	}
	var b builder
	for len(block) > 0 {
		var line []byte
		line, block, _ = bytes.Cut(block, []byte{'\n'})
		line = bytes.TrimSuffix(line, []byte{'\r'})
		name, value, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		b.set(string(bytes.TrimSpace(name)), value[:len(value):len(value)])
	}
	return b.h, true
}

// parseRS2 parses an rs2 block of length-prefixed names and values,
// reporting false for a truncated field or a name that is not UTF-8.
func parseRS2(block []byte) (Headers, bool) {
	var b builder
	for len(block) > 0 {
		name, rest, ok := cutField(block)
		if !ok || !utf8.Valid(name) {
			return nil, false
		}
		value, rest, ok := cutField(rest)
		if !ok {
			return nil, false
		}
		b.set(string(name), value)
		block = rest
	}
	return b.h, true
}

// cutField splits a big-endian u32 length and that many bytes off the front
// of p, reporting false when p is too short for either.
func cutField(p []byte) (field, rest []byte, ok bool) {
	if len(p) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(p)
	p = p[4:]
	if uint64(n) > uint64(len(p)) {
		return nil, nil, false
	}
	return p[:n:n], p[n:], true
}

// indexAfter is the header count beyond which a builder indexes names.
const indexAfter = 8

// builder collects decoded headers with the result of [Headers.Set]. Set
// scans every name, which would make a record with many distinct names
// quadratic to decode, so past indexAfter headers the builder keeps a map
// from name to position.
type builder struct {
	h   Headers
	pos map[string]int
}

// set inserts name=value as [Headers.Set] does.
func (b *builder) set(name string, value []byte) {
	if b.pos == nil {
		if len(b.h) < indexAfter {
			b.h.Set(name, value)
			return
		}
		b.pos = make(map[string]int, 2*len(b.h))
		for i, e := range b.h {
			b.pos[e.Name] = i
		}
	}
	name = lowerASCII(name)
	if i, ok := b.pos[name]; ok {
		b.h[i].Value = value
		return
	}
	b.pos[name] = len(b.h)
	b.h = append(b.h, Header{Name: name, Value: value})
}
