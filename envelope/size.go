package envelope

import (
	"encoding/base64"
	"unicode/utf8"
)

// Size returns the size of the record of headers h and payload, the
// measure [MaxLen] bounds the encoded record by: the payload's length plus,
// for each header, the lengths of its name (as [Encode] writes it) and
// value and the 8 bytes of the rs2 form's two length fields (settlement.md
// §9.3), which an rs1 line ("name: value\n") does not exceed.
func Size(h Headers, payload []byte) int {
	n := len(payload)
	for _, e := range h {
		name := len(e.Name)
		if !utf8.ValidString(e.Name) { // written with U+FFFD for each bad sequence
			name = len(appendLossy(nil, e.Name))
		}
		n += 8 + name + len(e.Value)
	}
	return n
}

// MaxLen returns the length of the longest record [Encode] writes for
// headers and a payload whose [Size] is at most size, on either transport:
// an envelope of them, its prefix and the base64 of the block length, the
// block and the payload.
func MaxLen(size int) int {
	return len(rs1Prefix) + base64.StdEncoding.EncodedLen(4+size)
}
