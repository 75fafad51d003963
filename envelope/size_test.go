package envelope

import (
	"strings"
	"testing"
)

// TestMaxLen: MaxLen(Size(h, payload)) bounds the record Encode writes,
// on both transports, and is its length for an rs2 envelope.
func TestMaxLen(t *testing.T) {
	tests := []struct {
		name    string
		h       Headers
		payload string
		rs2     bool // the bound is the length
	}{
		{"plain", nil, `{"id":7}`, false},
		{"empty", nil, "", false},
		{"no headers, enveloped on a line", nil, " padded\n", false},
		{"an envelope's prefix", nil, "rs1:AAAAAA==", false},
		{"rs1", hdrs("x-tenant", "acme", RetryCountHeader, "18446744073709551615"), "payload", false},
		{"rs1, empty names and values", Headers{{Name: "", Value: nil}, {Name: "a", Value: nil}}, "", false},
		{"rs2, a colon in a name", hdrs("a:b", "v", SequenceHeader, "1"), "p", true},
		{"rs2, a value with a newline", hdrs("x", "1\n2"), strings.Repeat("y", 1000), true},
		{"rs2, a name not UTF-8", Headers{{Name: "\xff\xfe", Value: []byte("v")}}, "p", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bound := MaxLen(Size(tt.h, []byte(tt.payload)))
			for _, line := range []bool{false, true} {
				n := len(Encode(tt.h, []byte(tt.payload), line))
				if n > bound || (tt.rs2 && n != bound) {
					t.Errorf("line=%v: record of %d bytes, bound %d", line, n, bound)
				}
			}
		})
	}
}
