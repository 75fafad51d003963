package envelope

import (
	"math"
	"testing"
)

// countTests is the attempt-count table of settlement.md §3 with checklist
// items 6 and 7. A nil value means the header is absent.
var countTests = []struct {
	name  string
	value []byte
	want  uint64
}{
	{"item7/absent", nil, 0},
	{"item7/abc", []byte("abc"), 0},
	{"item7/empty", []byte(""), 0},
	{"item7/negative", []byte("-1"), 0},
	{"item7/fraction", []byte("1.5"), 0},
	{"item7/not_utf8", []byte("\xff1"), 0},
	{"item7/overflow", []byte("99999999999999999999"), 0},
	{"item6/four", []byte("4"), 4},
	{"sec3/one", []byte("1"), 1},
	{"sec3/zero", []byte("0"), 0},
	{"sec3/plus", []byte("+7"), 7},
	{"sec3/leading_space", []byte(" 1"), 0},
	{"sec3/trailing_space", []byte("1 "), 0},
	{"sec3/embedded_space", []byte("1 2"), 0},
	{"sec3/plus_only", []byte("+"), 0},
	{"sec3/two_plus", []byte("++1"), 0},
	{"sec3/plus_minus", []byte("+-1"), 0},
	{"sec3/minus_zero", []byte("-0"), 0},
	{"sec3/leading_zeros", []byte("007"), 7},
	{"sec3/underscore", []byte("1_000"), 0},
	{"sec3/hex", []byte("0x10"), 0},
	{"sec3/exponent", []byte("1e3"), 0},
	{"sec3/fullwidth_digit", []byte("\uff11"), 0},
	{"sec3/max", []byte("18446744073709551615"), math.MaxUint64},
	{"sec3/max_plus_one", []byte("18446744073709551616"), 0},
}

func TestRetryCount(t *testing.T) {
	for _, tt := range countTests {
		t.Run(tt.name, func(t *testing.T) {
			h := hdrs("x-tenant", "acme")
			if tt.value != nil {
				h.Set(RetryCountHeader, tt.value)
			}
			if got := RetryCount(h); got != tt.want {
				t.Errorf("RetryCount(%q) = %d, want %d", tt.value, got, tt.want)
			}
		})
	}
}

// TestNextAttemptHeaders covers settlement.md §4.2 with checklist items 5–7
// and 14: the copy keeps every header in order, carries the next count in
// plain decimal, and leaves the delivery's headers untouched.
func TestNextAttemptHeaders(t *testing.T) {
	tests := []struct {
		name string
		in   Headers
		want Headers
	}{
		{"item5/first_copy", nil, hdrs(RetryCountHeader, "1")},
		{"item6/four_becomes_five", hdrs(RetryCountHeader, "4"), hdrs(RetryCountHeader, "5")},
		{"item7/abc", hdrs(RetryCountHeader, "abc"), hdrs(RetryCountHeader, "1")},
		{"item7/empty", hdrs(RetryCountHeader, ""), hdrs(RetryCountHeader, "1")},
		{"item7/negative", hdrs(RetryCountHeader, "-1"), hdrs(RetryCountHeader, "1")},
		{"item7/fraction", hdrs(RetryCountHeader, "1.5"), hdrs(RetryCountHeader, "1")},
		{"item7/not_utf8", hdrs(RetryCountHeader, "\xff"), hdrs(RetryCountHeader, "1")},
		{"item7/overflow", hdrs(RetryCountHeader, "99999999999999999999"), hdrs(RetryCountHeader, "1")},
		{"sec3/plus_unpadded", hdrs(RetryCountHeader, "+0009"), hdrs(RetryCountHeader, "10")},
		{"sec3/wraps", hdrs(RetryCountHeader, "18446744073709551615"), hdrs(RetryCountHeader, "0")},
		{
			"item14/keeps_headers_in_place",
			hdrs("x-tenant", "acme", RetryCountHeader, "2", SequenceHeader, "41"),
			hdrs("x-tenant", "acme", RetryCountHeader, "3", SequenceHeader, "41"),
		},
		{
			"item14/appends_count",
			hdrs("x-tenant", "acme", SequenceHeader, "41"),
			hdrs("x-tenant", "acme", SequenceHeader, "41", RetryCountHeader, "1"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.in.Clone()
			got := NextAttemptHeaders(tt.in)
			if !sameHeaders(got, tt.want) {
				t.Errorf("NextAttemptHeaders(%s) = %s, want %s", fmtHeaders(tt.in), fmtHeaders(got), fmtHeaders(tt.want))
			}
			if !sameHeaders(tt.in, before) {
				t.Errorf("NextAttemptHeaders modified its input to %s", fmtHeaders(tt.in))
			}
			if len(got) > 0 && len(tt.in) > 0 {
				got[0].Value[0] ^= 0xFF
				if !sameHeaders(tt.in, before) {
					t.Errorf("NextAttemptHeaders result shares values with its input")
				}
			}
		})
	}
}

func TestHeadersDelete(t *testing.T) {
	h := hdrs("a", "1", "X-Streamd-Origin", "billing", "b", "2")
	h.Delete("x-streamd-origin")
	if want := hdrs("a", "1", "b", "2"); !sameHeaders(h, want) {
		t.Errorf("after Delete: %s, want %s", fmtHeaders(h), fmtHeaders(want))
	}
	h.Delete("missing")
	if len(h) != 2 {
		t.Errorf("deleting a missing header changed %s", fmtHeaders(h))
	}
}
