package envelope

import (
	"bytes"
	"encoding/binary"
	"unicode/utf8"
)

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

// decode decodes an envelope, reporting false when record is plain. It
// takes the steps a [Parser] takes, in another order: it checks the whole
// text before it decodes it, into new memory.
func decode(record []byte) (Headers, []byte, bool) {
	rs1, ok := prefixRS1(record)
	if !ok {
		return nil, nil, false // most plain records
	}
	text := record[len(rs1Prefix):]
	n, pad, ok := decodedLen(text)
	if !ok || !wellFormed(text, pad) {
		return nil, nil, false
	}
	framed := appendQuanta(nil, text)[:n]
	end, ok := blockEnd(framed, n)
	if !ok {
		return nil, nil, false
	}
	var b builder
	if !b.parse(rs1, framed[4:end:end]) {
		return nil, nil, false
	}
	return b.h, framed[end:], true
}

// decodedLen returns the length n the base64 text of an envelope (the
// record after its prefix) decodes to, and the count of '=' that pad it.
// It reports false when the length of text says the record is plain: the
// padding is required (whole quanta only), and n is at least 4, for the
// block length. Whether the text is base64 is [wellFormed]'s to say.
func decodedLen(text []byte) (n, pad int, ok bool) {
	if len(text)%4 != 0 {
		return 0, 0, false
	}
	for pad < 2 && pad < len(text) && text[len(text)-1-pad] == '=' {
		pad++
	}
	n = len(text)/4*3 - pad
	return n, pad, n >= 4
}

// wellFormed reports whether text, whole quanta that end in pad '=', is
// strict standard base64 (settlement.md §9.4): every other byte in the
// alphabet (so no '\r' or '\n', which Go's decoder would skip), and the
// bits the padding leaves unused zero. Text that is well-formed is ASCII,
// and thus valid UTF-8, as §9.4 step 1 requires.
func wellFormed(text []byte, pad int) bool {
	body := text[:len(text)-pad]
	// The unused bits are the low 4 of the last character's 6 before
	// "==", the low 2 before "=".
	return inAlphabet(body) && sextets[body[len(body)-1]]&(1<<(2*pad)-1) == 0
}

// Prefixed reports whether record starts with an envelope prefix (rs1: or
// rs2:). A record that does not is plain, whatever follows; one that does
// is an envelope only if the rest is well-formed (Decode, Parser.Check).
// It lets a reader that has the record's first bytes at hand tell most
// plain records from envelopes once, for another goroutine that then need
// not look at the record at all.
func Prefixed(record []byte) bool {
	_, ok := prefixRS1(record)
	return ok
}

// prefixRS1 reports whether record starts with an envelope prefix, and
// whether that prefix is rs1: rather than rs2:.
func prefixRS1(record []byte) (rs1, ok bool) {
	switch {
	case len(record) == 0 || record[0] != rs1Prefix[0]: // rs2Prefix's too (TestPrefixesShareFirstByte)
		return false, false // most plain records: one byte looked at
	case bytes.HasPrefix(record, []byte(rs1Prefix)):
		return true, true
	case bytes.HasPrefix(record, []byte(rs2Prefix)):
		return false, true
	}
	return false, false
}

// blockEnd returns where the header block ends in the framed bytes of an
// envelope, whose first 4 bytes (at least) are in head and which decode to
// n bytes in all: 4 plus the block length they hold. It reports false when
// n is too short for the length or for the block (settlement.md §9.4
// step 3).
func blockEnd(head []byte, n int) (int, bool) {
	if n < 4 {
		return 0, false
	}
	size := binary.BigEndian.Uint32(head)
	if uint64(size) > uint64(n-4) {
		return 0, false
	}
	return 4 + int(size), true
}

// parse parses an rs1 or an rs2 header block into b.h, reporting false
// when an rs2 block is malformed.
func (b *builder) parse(rs1 bool, block []byte) bool {
	if rs1 {
		walkRS1(b.utf8(block), func(name, value []byte) {
			b.set(bytes.TrimSpace(name), trimValue(value))
		})
		return true
	}
	return walkRS2(block, b.set)
}

// utf8 returns an rs1 block as UTF-8 text: itself, or a copy in b's memory
// with its invalid bytes replaced.
func (b *builder) utf8(block []byte) []byte {
	if utf8.Valid(block) {
		return block
	}
	b.lossy = appendLossy(b.lossy[:0], block)
	return b.lossy
}

// walkRS1 calls fn with each header line of an rs1 block (UTF-8 text, one
// header per line that contains ':'), in order, cut at its first ':' and
// untrimmed: the header's name is bytes.TrimSpace of the first part, its
// value trimValue of the second. It never fails.
func walkRS1(block []byte, fn func(name, value []byte)) {
	for len(block) > 0 {
		var line []byte
		line, block, _ = bytes.Cut(block, []byte{'\n'})
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if name, value, ok := bytes.Cut(line, []byte{':'}); ok {
			fn(name, value)
		}
	}
}

// trimValue returns an rs1 header's value as its line holds it: trimmed,
// and with no room to grow into the block after it.
func trimValue(v []byte) []byte {
	v = bytes.TrimSpace(v)
	return v[:len(v):len(v)]
}

// walkRS2 calls fn with the name and value of each header of an rs2 block
// of length-prefixed names and values, in order, reporting false for a
// truncated field or a name that is not UTF-8 (fn has then been called for
// the headers before it).
func walkRS2(block []byte, fn func(name, value []byte)) bool {
	for len(block) > 0 {
		name, rest, ok := cutField(block)
		if !ok || !utf8.Valid(name) {
			return false
		}
		value, rest, ok := cutField(rest)
		if !ok {
			return false
		}
		fn(name, value)
		block = rest
	}
	return true
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

// maxInterned bounds the names a builder interns: the names of a stream's
// records are few, and a stream of ever new names must not grow memory.
const maxInterned = 64

// builder collects decoded headers with the result of [Headers.Set]. Set
// scans every name, which would make a record with many distinct names
// quadratic to decode, so past indexAfter headers the builder keeps a map
// from name to position.
type builder struct {
	h Headers
	// pos maps each name in h to its position once the block has reached
	// indexAfter headers, and is empty before; reset clears it but keeps
	// its memory for the next block.
	pos map[string]int
	// names, when not nil, interns names: each name as the block spells
	// it, mapped to its lowercased string, so that a name seen before is
	// made without allocating. Nil: every name is a new string.
	names map[string]string
	// lossy holds an rs1 block that is not valid UTF-8, with the
	// replacement characters; the values of its headers slice it.
	lossy []byte
}

// reset empties b for the next block, keeping its memory, the index's
// too.
func (b *builder) reset() {
	b.h = b.h[:0]
	clear(b.pos)
}

// name returns the header name spelt raw, lowercased.
func (b *builder) name(raw []byte) string {
	if b.names == nil {
		return lowerASCII(string(raw))
	}
	if name, ok := b.names[string(raw)]; ok {
		return name
	}
	key := string(raw)
	name := lowerASCII(key) // key itself when already lowercase
	if len(b.names) < maxInterned {
		b.names[key] = name
	}
	return name
}

// set inserts the header spelt raw with value, as [Headers.Set] does.
func (b *builder) set(raw, value []byte) {
	name := b.name(raw)
	if len(b.h) < indexAfter {
		b.h.set(name, value)
		return
	}
	if len(b.pos) == 0 { // the block reaches indexAfter headers: index them
		if b.pos == nil {
			b.pos = make(map[string]int, 2*len(b.h))
		}
		for i, e := range b.h {
			b.pos[e.Name] = i
		}
	}
	if i, ok := b.pos[name]; ok {
		b.h[i].Value = value
		return
	}
	b.pos[name] = len(b.h)
	b.h = append(b.h, Header{Name: name, Value: value})
}
