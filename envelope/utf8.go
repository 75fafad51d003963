package envelope

import "unicode/utf8"

// appendLossy appends s to dst with each maximal ill-formed subsequence
// replaced by one U+FFFD. This is the Unicode recommended practice (The
// Unicode Standard §3.9, "U+FFFD Substitution of Maximal Subparts") that
// Rust's String::from_utf8_lossy follows, so an rs1 block with invalid bytes
// decodes to the same text as in the reference runtime. Go's
// [bytes.ToValidUTF8] would instead merge a run of invalid bytes into one
// U+FFFD.
func appendLossy[S ~string | ~[]byte](dst []byte, s S) []byte {
	start := 0 // start of the pending well-formed run
	for i := 0; i < len(s); {
		n, ok := scanUTF8(s[i:])
		if !ok {
			dst = append(dst, s[start:i]...)
			dst = append(dst, string(utf8.RuneError)...)
			start = i + n
		}
		i += n
	}
	return append(dst, s[start:]...)
}

// scanUTF8 returns the length of the well-formed UTF-8 sequence at the start
// of the non-empty s and true, or, when that sequence is ill-formed, the
// length of its maximal subpart (at least 1) and false. The byte ranges are
// those of The Unicode Standard, Table 3-7.
func scanUTF8[S ~string | ~[]byte](s S) (int, bool) {
	c := s[0]
	if c < utf8.RuneSelf {
		return 1, true
	}
	var need int                     // continuation bytes that must follow c
	lo, hi := byte(0x80), byte(0xBF) // range of the first continuation byte
	switch {
	case 0xC2 <= c && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case 0xE1 <= c && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case 0xF1 <= c && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1, false
	}
	for k := 1; k <= need; k++ {
		if k >= len(s) || s[k] < lo || s[k] > hi {
			return k, false
		}
		lo, hi = 0x80, 0xBF
	}
	return need + 1, true
}
