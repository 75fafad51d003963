package envelope

import (
	"bytes"
	"encoding/binary"
	"slices"
	"unsafe"
)

// A Parser decodes envelopes into memory it keeps from one record to the
// next, for a reader that handles one record at a time: in steady state it
// allocates nothing. [Parser.Parse] decides whether a record is an
// envelope exactly as [Decode] does, but decodes only the header block at
// its front; [Parser.Payload] decodes the payload when it is wanted, so that
// a record whose payload nobody reads costs a check of its text and the
// decoding of its headers. [Parser.PeekHeader] and [Parser.Check] split
// Parse in two, for a reader that needs one header, and needs to know
// whether the record is an envelope only when it carries that header.
//
// What a Parser returns is in its memory, which the next record
// overwrites: the header values are valid until its next Parse or
// PeekHeader, the payload until then or its next Payload. The header
// names are strings, which stay valid; a name seen before is not
// allocated again. A caller that keeps headers or a payload
// longer copies them ([Headers.Clone], bytes.Clone). The record must stay
// unchanged until the Parser is done with it: Check and Payload read it
// again.
//
// The zero Parser is ready to use. A Parser is not safe for concurrent use.
type Parser struct {
	b builder
	// text is the base64 text of the record last peeked (the record after
	// its prefix), nil when it cannot be an envelope. It is the record's
	// memory, not a copy.
	text []byte
	n    int // the length text decodes to
	pad  int // the '=' that end text
	// valid is set once Check found text well-formed.
	valid   bool
	start   int    // the offset of the payload in the decoded text
	head    []byte // the decoded text up to the end of the header block
	payload []byte // the decoded payload, with up to 2 bytes before it
}

// Parse reports whether record is a well-formed rs1: or rs2: envelope
// (settlement.md §9.4), deciding exactly as [Decode] does, and returns its
// headers, with the lowercased unique names and the values Decode returns.
// A record that is not an envelope is plain: Parse reports false, and its
// payload is the whole record. Parse decodes the header block at the
// front of record, then checks its text as [Parser.Check] does.
func (p *Parser) Parse(record []byte) (Headers, bool) {
	h, ok := p.peek(record)
	if !ok || !p.Check() {
		return nil, false
	}
	return h, true
}

// peek decodes the header block at the front of record and returns the
// headers record carries if it is an envelope, without checking its base64
// text: whether it is an envelope is Check's to say. Until Check says so,
// the headers are only what the record would carry: decoded from a text
// that may hold bytes outside the alphabet, they may be garbage. peek
// reports false when record is certainly plain (its prefix, its length,
// its block length or its rs2 block say so); Check then reports false
// too. peek then Check is Parse.
func (p *Parser) peek(record []byte) (Headers, bool) {
	text, rs1, block, ok := p.block(record)
	if !ok {
		return nil, false
	}
	if p.b.names == nil {
		p.b.names = make(map[string]string)
	}
	p.b.reset()
	if !p.b.parse(rs1, block) {
		return nil, false
	}
	p.text = text
	return p.b.h, true
}

// PeekHeader is the first half of Parse for a reader that needs one
// header: it decodes the header block at the front of record and returns
// the value of the header name that Parse's headers would hold, without
// making them, and without checking the record's base64 text: whether it
// is an envelope is [Parser.Check]'s to say. Until Check says so, the
// value is only what the record would carry: decoded from a text that may
// hold bytes outside the alphabet, it may be garbage. PeekHeader reports
// false when record is certainly plain (its prefix, its length, its block
// length or its rs2 block say so; Check then reports false too), or
// carries no such header. PeekHeader then Check suits a reader that needs
// to know whether the record is an envelope only when it carries the
// header.
func (p *Parser) PeekHeader(record []byte, name string) (value []byte, found bool) {
	text, rs1, block, ok := p.block(record)
	if !ok {
		return nil, false
	}
	name = lowerASCII(name)
	if rs1 {
		walkRS1(p.b.utf8(block), func(n, v []byte) {
			// A name shorter than the one sought is none of its spellings.
			if len(n) >= len(name) && lowerEqual(bytes.TrimSpace(n), name) {
				value, found = trimValue(v), true // the last one, as Headers.Set keeps
			}
		})
	} else if !walkRS2(block, func(n, v []byte) {
		if lowerEqual(n, name) {
			value, found = v, true
		}
	}) {
		return nil, false
	}
	p.text = text
	return value, found
}

// lowerEqual reports whether raw, lowercased as header names are
// ([lowerASCII]), is name.
func lowerEqual(raw []byte, name string) bool {
	if len(raw) != len(name) {
		return false
	}
	for i, c := range raw {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// block decodes the header block at the front of record into p's memory
// and returns it, with the record's base64 text and whether it is rs1:
// false when record is certainly plain (its prefix, its length or its
// block length say so). peek and PeekHeader keep the text, for Check and
// Payload, once they have read the block.
func (p *Parser) block(record []byte) (text []byte, rs1 bool, block []byte, ok bool) {
	p.text, p.valid = nil, false
	rs1, ok = prefixRS1(record)
	if !ok {
		return nil, false, nil, false
	}
	text = record[len(rs1Prefix):]
	n, pad, ok := decodedLen(text)
	if !ok {
		return nil, false, nil, false
	}
	// The block length is in the first 4 of the 6 bytes the first 8
	// characters decode to; then decode the quanta that hold the block.
	p.head = appendQuanta(p.head[:0], text[:8])
	end, ok := blockEnd(p.head, n)
	if !ok {
		return nil, false, nil, false
	}
	p.head = appendQuanta(p.head, text[8:quantaLen(end)]) // end is 4 or more
	p.n, p.pad, p.start = n, pad, end
	return text, rs1, p.head[4:end:end], true
}

// Check reports whether the record last peeked is an envelope, deciding
// exactly as [Decode] does: it checks the record's text, 16 bytes at a
// time, without decoding it. The text must be strict standard base64
// (settlement.md §9.4): every byte in the alphabet (so no '\r' or '\n',
// which Go's decoder would skip), whole quanta with their padding, and the
// bits the padding leaves unused zero.
func (p *Parser) Check() bool {
	if p.text == nil || p.valid {
		return p.valid
	}
	p.valid = wellFormed(p.text, p.pad)
	if !p.valid {
		p.text = nil
	}
	return p.valid
}

// Payload returns the payload of the envelope the last Parse, or the last
// PeekHeader and Check, accepted, decoded into p's memory: valid until the
// next Parse, PeekHeader or Payload. It returns nil when
// they did not accept the record: its payload is then the record itself.
func (p *Parser) Payload() []byte {
	if !p.valid {
		return nil
	}
	// Decode from the quantum that holds the payload's first byte, and
	// skip the bytes of the block that quantum also holds.
	first := p.start / 3
	p.payload = appendQuanta(p.payload[:0], p.text[first*4:])
	return p.payload[p.start-first*3 : p.n-first*3]
}

// Release lets go of the record last peeked, which p keeps for Check and
// Payload, so that p does not keep it alive until the next one, and of
// the memory p decoded it into where that grew past limit bytes, as a
// large record makes it: what p returned for that record is no longer
// valid. Memory within limit is kept, and the next record is decoded into
// it without allocating.
func (p *Parser) Release(limit int) {
	p.text, p.valid = nil, false
	if cap(p.head) > limit {
		p.head = nil
	}
	if cap(p.payload) > limit {
		p.payload = nil
	}
	if cap(p.b.lossy) > limit {
		p.b.lossy = nil
	}
	// The header values are slices of that memory; a block of many
	// headers lets go of their slice and index too.
	if p.b.h = ReleaseHeaders(p.b.h, limit); p.b.h == nil {
		p.b.pos = nil
	}
}

// ReleaseHeaders returns h emptied, its values let go of, and its memory
// too when it takes more than limit bytes, for a caller that keeps h
// between records (see [Parser.Release]).
func ReleaseHeaders(h Headers, limit int) Headers {
	if cap(h)*int(unsafe.Sizeof(Header{})) > limit {
		return nil
	}
	clear(h[:cap(h)])
	return h[:0]
}

// quantaLen is the length of the base64 text of the n first decoded bytes,
// whole 4-character quanta.
func quantaLen(n int) int {
	return (n + 2) / 3 * 4
}

// appendQuanta appends the bytes text decodes to, 3 for each 4 characters
// (text is whole quanta), to dst, growing it when it is too short. It
// decodes without checks: each byte is taken as a character of the
// alphabet, and any other byte, '=' included, as 0, so that the bytes are
// right when the text is well-formed, and the padding's are to be cut.
func appendQuanta(dst, text []byte) []byte {
	// 8 characters at a time: 6 bytes, written as 8.
	j := len(dst)
	dst = slices.Grow(dst, len(text)/4*3+2)
	dst = dst[:cap(dst)]
	t := &sextets
	for ; len(text) >= 8; text = text[8:] {
		v := uint64(t[text[0]])<<58 | uint64(t[text[1]])<<52 | uint64(t[text[2]])<<46 | uint64(t[text[3]])<<40 |
			uint64(t[text[4]])<<34 | uint64(t[text[5]])<<28 | uint64(t[text[6]])<<22 | uint64(t[text[7]])<<16
		binary.BigEndian.PutUint64(dst[j:], v)
		j += 6
	}
	if len(text) == 4 {
		v := uint32(t[text[0]])<<18 | uint32(t[text[1]])<<12 | uint32(t[text[2]])<<6 | uint32(t[text[3]])
		dst[j], dst[j+1], dst[j+2] = byte(v>>16), byte(v>>8), byte(v)
		j += 3
	}
	return dst[:j]
}

// sextets maps each character of the standard base64 alphabet to its
// 6-bit value, and every other byte to 0.
var sextets = func() (t [256]byte) {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for i := range len(alphabet) {
		t[alphabet[i]] = byte(i)
	}
	return t
}()

// The constants of inAlphabet, which works on words of 8 bytes: a byte
// below 0x80 plus 0x80-c has its high bit set when the byte is c or more,
// and plus 0x7f-c when it is more than c, without carrying into the next
// byte.
const (
	ones  = 0x0101010101010101
	highs = ones * 0x80
	lower = ones * 0x20 // ORed in, it makes A-Z a-z, and no other byte a-z
	geA   = ones * (0x80 - 'a')
	gtZ   = ones * (0x7f - 'z')
	geS   = ones * (0x80 - '/') // '/' is just before '0'
	gt9   = ones * (0x7f - '9')
	geP   = ones * (0x80 - '+')
	gtP   = ones * (0x7f - '+')
)

// alphabetWords holds the constants of outside16 as variables, which the
// compiler keeps in registers through its loop; constants it would load
// again for every word.
var alphabetWords = [...]uint64{lower, geA, gtZ, geS, gt9, geP, gtP}

// inAlphabet reports whether every byte of s is in the standard base64
// alphabet (A-Z, a-z, 0-9, '+', '/').
func inAlphabet(s []byte) bool {
	whole := len(s) &^ 15
	outside := outside16(s[:whole])
	if whole < len(s) {
		var tail [16]byte
		copy(tail[copy(tail[:], s[whole:]):], "AAAAAAAAAAAAAAAA")
		outside |= outside16(tail[:])
	}
	return outside&highs == 0
}

// outside16 looks at s, whose length is a multiple of 16, 16 bytes at a
// time, and returns a word with the high bit of a byte set when a byte of
// s is outside the base64 alphabet. A byte of 0x80 or more has its own
// high bit set; the sums for the others are exact.
func outside16(s []byte) uint64 {
	k := &alphabetWords
	lo, ga, gz, gs, g9, gp, gq := k[0], k[1], k[2], k[3], k[4], k[5], k[6]
	var outside uint64
	for ; len(s) >= 16; s = s[16:] {
		x, y := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:])
		lx, ly := x|lo, y|lo
		inX := (lx+ga)&^(lx+gz) | (x+gs)&^(x+g9) | (x+gp)&^(x+gq)
		inY := (ly+ga)&^(ly+gz) | (y+gs)&^(y+g9) | (y+gp)&^(y+gq)
		outside |= x | y | ^(inX & inY)
	}
	return outside
}
