package envelope

import (
	"bytes"
	"math"
	"strconv"
)

// Header names with a meaning to settlement (settlement.md §1, §9.5).
const (
	// RetryCountHeader holds the number of deliveries made before the copy
	// that carries it, in decimal. The first delivery has none.
	RetryCountHeader = "x-ruststream-retry-count"
	// SequenceHeader holds the delivery's sequence in decimal. The reader
	// sets it on every delivery, over any value the envelope carried.
	SequenceHeader = "stream-sequence"
)

// RetryCount returns the value of [RetryCountHeader] in h: an unsigned
// decimal that fits in a uint64, optionally preceded by '+' (settlement.md
// §3). It returns 0 when the header is absent or holds anything else: an
// empty value, a '-' sign, a fraction, spaces, bytes that are not UTF-8, or
// a number past math.MaxUint64. The delivery is then on its first attempt.
func RetryCount(h Headers) uint64 {
	v, ok := h.Get(RetryCountHeader)
	if !ok {
		return 0
	}
	// Digits only, as strconv.ParseUint reads them in base 10. Every
	// delivery reads its count, and the loop never allocates, where
	// ParseUint(string(v)) allocates its error for a value it rejects,
	// and the string for a value longer than 32 bytes.
	v = bytes.TrimPrefix(v, []byte{'+'})
	if len(v) == 0 {
		return 0
	}
	var n uint64
	for _, c := range v {
		d := uint64(c - '0')
		if d > 9 || n > (math.MaxUint64-d)/10 {
			return 0
		}
		n = n*10 + d
	}
	return n
}

// SetRetryCount sets [RetryCountHeader] to n in decimal, without padding.
func (h *Headers) SetRetryCount(n uint64) {
	h.Set(RetryCountHeader, strconv.AppendUint(nil, n, 10))
}

// SetSequence sets [SequenceHeader] to seq in decimal, replacing any value
// the envelope carried (settlement.md §7.3, checklist item 48).
func (h *Headers) SetSequence(seq uint64) {
	h.Set(SequenceHeader, strconv.AppendUint(nil, seq, 10))
}

// NextAttemptHeaders returns the headers for a copy of a delivery with
// headers h (settlement.md §4.2): a deep copy of h, every header kept in
// order, with [RetryCountHeader] set to RetryCount(h)+1. h is not modified.
// The count wraps as the reference's u64 arithmetic does: a copy of a
// delivery whose count is math.MaxUint64 carries 0, so that the attempts
// of its copies grow again and reach the cap like any others.
func NextAttemptHeaders(h Headers) Headers {
	c := h.Clone()
	c.SetRetryCount(RetryCount(h) + 1)
	return c
}
