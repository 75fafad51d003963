package envelope

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// hdrs builds headers with Set from name, value pairs.
func hdrs(kv ...string) Headers {
	var h Headers
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], []byte(kv[i+1]))
	}
	return h
}

// frame returns prefix followed by the base64 of the framed block and
// payload, with the block length taken from the block.
func frame(prefix string, block, payload []byte) string {
	return frameLen(prefix, uint32(len(block)), block, payload)
}

// frameLen is frame with an explicit, possibly wrong, block length.
func frameLen(prefix string, size uint32, block, payload []byte) string {
	framed := binary.BigEndian.AppendUint32(nil, size)
	framed = append(append(framed, block...), payload...)
	return prefix + base64.StdEncoding.EncodeToString(framed)
}

// rs2Block returns the rs2 block of name, value pairs given as strings.
func rs2Block(kv ...string) []byte {
	var b []byte
	for _, f := range kv {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// sameHeaders reports whether got and want hold the same names and values in
// the same order. A nil value equals an empty one.
func sameHeaders(got, want Headers) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i].Name != want[i].Name || !bytes.Equal(got[i].Value, want[i].Value) {
			return false
		}
	}
	return true
}

// fmtHeaders renders h for failure messages.
func fmtHeaders(h Headers) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, e := range h {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q=%q", e.Name, e.Value)
	}
	b.WriteByte(']')
	return b.String()
}

// checkDecode fails t unless record decodes to want and payload.
func checkDecode(t *testing.T, record []byte, want Headers, payload []byte) {
	t.Helper()
	h, p := Decode(record)
	if !sameHeaders(h, want) {
		t.Errorf("Decode(%q) headers = %s, want %s", record, fmtHeaders(h), fmtHeaders(want))
	}
	if !bytes.Equal(p, payload) {
		t.Errorf("Decode(%q) payload = %q, want %q", record, p, payload)
	}
}

// vectors are the test vectors of settlement.md §9.6. file and line say which
// modes a row states; "any" and "file or line" rows set both.
var vectors = []struct {
	name       string
	headers    Headers
	payload    string
	file, line bool
	record     string
}{
	{
		name: "plain_json", payload: `{"id":7}`, file: true, line: true,
		record: `{"id":7}`,
	},
	{
		name: "retry_count", headers: hdrs("x-ruststream-retry-count", "1"), payload: `{"id":7}`,
		file: true, line: true,
		record: "rs1:AAAAHHgtcnVzdHN0cmVhbS1yZXRyeS1jb3VudDogMQp7ImlkIjo3fQ==",
	},
	{
		name:    "sequence_and_retry_count",
		headers: hdrs("stream-sequence", "3", "x-ruststream-retry-count", "1"), payload: `{"id":7}`,
		file: true, line: true,
		record: "rs1:AAAAL3N0cmVhbS1zZXF1ZW5jZTogMwp4LXJ1c3RzdHJlYW0tcmV0cnktY291bnQ6IDEKeyJpZCI6N30=",
	},
	{
		name: "binary_on_line", payload: "\x00\x9f\x92\x96\xff", line: true,
		record: "rs1:AAAAAACfkpb/",
	},
	{
		name: "newline_on_line", payload: "first\nsecond", line: true,
		record: "rs1:AAAAAGZpcnN0CnNlY29uZA==",
	},
	{
		name: "newline_in_file", payload: "first\nsecond", file: true,
		record: "first\nsecond",
	},
	{
		name: "payload_like_envelope", payload: "rs1:AAAAAA==", file: true, line: true,
		record: "rs1:AAAAAHJzMTpBQUFBQUE9PQ==",
	},
	{
		name: "value_with_newline", headers: hdrs("x-note", "a\nb"), payload: "payload",
		file: true, line: true,
		record: "rs2:AAAAEQAAAAZ4LW5vdGUAAAADYQpicGF5bG9hZA==",
	},
	{
		name: "content_type_empty_payload", headers: hdrs("content-type", "application/json"),
		file: true, line: true,
		record: "rs1:AAAAH2NvbnRlbnQtdHlwZTogYXBwbGljYXRpb24vanNvbgo=",
	},
}

// mode is one transport's setting of Encode's line flag.
type mode struct {
	name string
	line bool
}

// modes returns the modes a test applies to.
func modes(file, line bool) []mode {
	var m []mode
	if file {
		m = append(m, mode{"file", false})
	}
	if line {
		m = append(m, mode{"line", true})
	}
	return m
}

func TestVectors(t *testing.T) {
	for _, v := range vectors {
		for _, m := range modes(v.file, v.line) {
			t.Run("item43/"+v.name+"/"+m.name, func(t *testing.T) {
				got := Encode(v.headers, []byte(v.payload), m.line)
				if string(got) != v.record {
					t.Errorf("Encode = %q, want %q", got, v.record)
				}
				checkDecode(t, []byte(v.record), v.headers, []byte(v.payload))
			})
		}
	}
}

// TestPayloadLikeEnvelope covers checklist item 44: without headers, a
// payload that starts with an envelope prefix is enveloped on both
// transports and decodes back unchanged; one that merely resembles a prefix
// is not.
func TestPayloadLikeEnvelope(t *testing.T) {
	tests := []struct {
		name      string
		payload   string
		enveloped bool
	}{
		{"item44/rs1_prefix_only", "rs1:", true},
		{"item44/rs2_prefix_only", "rs2:", true},
		{"item44/rs1_valid_envelope", "rs1:AAAAAA==", true},
		{"item44/rs2_valid_envelope", "rs2:AAAAAA==", true},
		{"item44/rs1_invalid_base64", "rs1:not base64", true},
		{"item44/rs2_text", "rs2: hello", true},
		{"item44/uppercase_prefix", "RS1:AAAAAA==", false},
		{"item44/other_prefix", "rs3:AAAAAA==", false},
		{"item44/no_colon", "rs1", false},
		{"item44/prefix_later", "x rs1:AAAAAA==", false},
	}
	for _, tt := range tests {
		for _, m := range modes(true, true) {
			t.Run(tt.name+"/"+m.name, func(t *testing.T) {
				payload := []byte(tt.payload)
				got := Encode(nil, payload, m.line)
				if enveloped := !bytes.Equal(got, payload); enveloped != tt.enveloped {
					t.Fatalf("Encode(%q) = %q, enveloped %v, want %v", payload, got, enveloped, tt.enveloped)
				}
				if tt.enveloped && !bytes.HasPrefix(got, []byte(rs1Prefix)) {
					t.Errorf("Encode(%q) = %q, want the rs1 form", payload, got)
				}
				checkDecode(t, got, nil, payload)
			})
		}
	}
}

// TestForm covers checklist item 45: headers that the rs1 form would alter
// use rs2, all others rs1, and either way the headers round-trip byte for
// byte.
func TestForm(t *testing.T) {
	tests := []struct {
		name    string
		headers Headers
		form    string
	}{
		{"item45/value_with_cr", hdrs("x-a", "a\rb"), rs2Prefix},
		{"item45/value_with_trailing_cr", hdrs("x-a", "a\r"), rs2Prefix},
		{"item45/value_with_newline", hdrs("x-a", "a\nb"), rs2Prefix},
		{"item45/value_with_crlf", hdrs("x-a", "a\r\nb"), rs2Prefix},
		{"item45/value_with_leading_space", hdrs("x-a", " a"), rs2Prefix},
		{"item45/value_with_trailing_space", hdrs("x-a", "a "), rs2Prefix},
		{"item45/value_with_leading_tab", hdrs("x-a", "\ta"), rs2Prefix},
		{"item45/value_only_space", hdrs("x-a", " "), rs2Prefix},
		{"item45/value_with_trailing_nbsp", hdrs("x-a", "a\u00a0"), rs2Prefix},
		{"item45/value_with_leading_ideographic_space", hdrs("x-a", "\u3000a"), rs2Prefix},
		{"item45/value_with_trailing_line_separator", hdrs("x-a", "a\u2028"), rs2Prefix},
		{"item45/value_not_utf8", hdrs("x-a", "\xff\xfe"), rs2Prefix},
		{"item45/value_truncated_utf8", hdrs("x-a", "caf\xc3"), rs2Prefix},
		{"item45/value_surrogate", hdrs("x-a", "\xed\xa0\x80"), rs2Prefix},
		{"item45/name_with_colon", hdrs("x:a", "1"), rs2Prefix},
		{"item45/name_with_newline", hdrs("x\na", "1"), rs2Prefix},
		{"item45/name_with_cr", hdrs("x\ra", "1"), rs2Prefix},
		{"item45/name_with_leading_space", hdrs(" x-a", "1"), rs2Prefix},
		{"item45/name_with_trailing_space", hdrs("x-a ", "1"), rs2Prefix},
		{"item45/one_header_needs_rs2", hdrs("x-a", "1", "x-b", "two\nlines", "x-c", "3"), rs2Prefix},
		{"item45/plain", hdrs("x-a", "1"), rs1Prefix},
		{"item45/value_with_inner_space", hdrs("x-a", "a b"), rs1Prefix},
		{"item45/value_with_inner_tab", hdrs("x-a", "a\tb"), rs1Prefix},
		{"item45/value_with_colon", hdrs("x-a", "a: b:c"), rs1Prefix},
		{"item45/value_unicode", hdrs("x-a", "héllo ✓"), rs1Prefix},
		{"item45/value_with_bom", hdrs("x-a", "\ufeffa"), rs1Prefix},
		{"item45/value_with_nul", hdrs("x-a", "a\x00b"), rs1Prefix},
		{"item45/value_empty", hdrs("x-a", ""), rs1Prefix},
		{"item45/value_replacement_char", hdrs("x-a", "\ufffd"), rs1Prefix},
		{"item45/name_empty", hdrs("", "v"), rs1Prefix},
		{"item45/name_with_inner_space", hdrs("x a", "v"), rs1Prefix},
		{"item45/name_unicode", hdrs("x-ü", "v"), rs1Prefix},
		{"item45/many_headers", hdrs("a", "1", "b", "2", "c", "3"), rs1Prefix},
	}
	for _, tt := range tests {
		for _, m := range modes(true, true) {
			t.Run(tt.name+"/"+m.name, func(t *testing.T) {
				payload := []byte("payload")
				got := Encode(tt.headers, payload, m.line)
				if !bytes.HasPrefix(got, []byte(tt.form)) {
					t.Fatalf("Encode = %q, want the %s form", got, tt.form)
				}
				checkDecode(t, got, tt.headers, payload)
			})
		}
	}
}

// TestMalformed covers checklist item 46 and the other failures of
// settlement.md §9.4: each record is plain, returned whole without headers.
func TestMalformed(t *testing.T) {
	good := vectors[1].record // a valid rs1 record
	tests := []struct {
		name   string
		record string
	}{
		{"item46/invalid_base64", "rs1:!!!!"},
		{"item46/base64_with_newline", good[:20] + "\n" + good[20:]},
		{"item46/base64_with_cr", good[:20] + "\r" + good[20:]},
		{"item46/base64_with_trailing_newline", good + "\n"},
		{"item46/base64_with_trailing_crlf", good + "\r\n"},
		{"item46/decoded_empty", "rs1:"},
		{"item46/decoded_one_byte", "rs1:AA=="},
		{"item46/decoded_three_bytes", "rs1:AAAA"},
		{"item46/block_length_overruns", frameLen(rs1Prefix, 100, []byte("x: 1\n"), nil)},
		{"item46/block_length_overruns_by_one", frameLen(rs1Prefix, 6, []byte("x: 1\n"), nil)},
		{"item46/block_length_max", frameLen(rs1Prefix, 0xFFFFFFFF, []byte("x: 1\n"), nil)},
		{"item46/rs2_name_length_overruns", frame(rs2Prefix, rs2Block("x-a", "1")[:5], []byte("p"))},
		{"item46/rs2_name_length_overruns_by_one", frame(rs2Prefix, append(binary.BigEndian.AppendUint32(nil, 4), "abc"...), nil)},
		{"sec9.4/rs2_value_length_overruns", frame(rs2Prefix, rs2Block("x-a", "1")[:10], []byte("p"))},
		{"sec9.4/rs2_value_length_missing", frame(rs2Prefix, rs2Block("x-a", "1")[:7], nil)},
		{"sec9.4/rs2_value_length_partial", frame(rs2Prefix, rs2Block("x-a", "1")[:9], nil)},
		{"sec9.4/rs2_name_length_partial", frame(rs2Prefix, rs2Block("x-a", "1", "x-b", "2")[:17], nil)},
		{"sec9.4/rs2_name_not_utf8", frame(rs2Prefix, rs2Block("x-\xff", "1"), []byte("p"))},
		{"sec9.4/rs2_second_name_not_utf8", frame(rs2Prefix, rs2Block("x-a", "1", "\xc0\x80", "2"), nil)},
		{"sec9.4/missing_padding", strings.TrimRight(good, "=")},
		{"sec9.4/extra_padding", good + "="},
		{"sec9.4/nonzero_trailing_bits", "rs1:AAAAAB=="},
		{"sec9.4/url_alphabet", "rs1:AAAAAACfkpb_"},
		{"sec9.4/inner_space", good[:20] + " " + good[20:]},
		{"sec9.4/inner_tab", good[:20] + "\t" + good[20:]},
		{"sec9.4/leading_space", "rs1: " + good[4:]},
		{"sec9.4/not_utf8", "rs1:\xff"},
		{"sec9.4/padding_inside", "rs1:AA==AAAA"},
		{"sec9.4/uppercase_prefix", "RS1:" + good[4:]},
		{"sec9.4/other_prefix", "rs3:" + good[4:]},
		{"sec9.4/empty_record", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			record := []byte(tt.record)
			h, p := Decode(record)
			if h != nil {
				t.Errorf("Decode(%q) headers = %s, want none", record, fmtHeaders(h))
			}
			if !bytes.Equal(p, record) {
				t.Errorf("Decode(%q) payload = %q, want the whole record", record, p)
			}
		})
	}
}

// TestDecodeRS1 covers checklist item 47 and the other rs1 rules of
// settlement.md §9.4.
func TestDecodeRS1(t *testing.T) {
	tests := []struct {
		name  string
		block string
		want  Headers
	}{
		{"item47/garbage_and_duplicates", "garbage\nX-A :  1 \nx-a: 2\n", hdrs("x-a", "2")},
		{"sec9.4/empty_block", "", nil},
		{"sec9.4/no_final_newline", "x-a: 1\nx-b: 2", hdrs("x-a", "1", "x-b", "2")},
		{"sec9.4/crlf_lines", "x-a: 1\r\nx-b: 2\r\n", hdrs("x-a", "1", "x-b", "2")},
		{"sec9.4/one_cr_stripped", "x-a: 1\r\r\n", hdrs("x-a", "1")},
		{"sec9.4/split_at_first_colon", "x-a: b: c\n", hdrs("x-a", "b: c")},
		{"sec9.4/no_space_after_colon", "x-a:1\n", hdrs("x-a", "1")},
		{"sec9.4/unicode_space_trimmed", "\u00a0x-a\u3000:\u2028 1 \u0085\n", hdrs("x-a", "1")},
		{"sec9.4/empty_name", ": v\n", hdrs("", "v")},
		{"sec9.4/empty_value", "x-a:\n", hdrs("x-a", "")},
		{"sec9.4/blank_lines", "\n\n\r\nx-a: 1\n\n", hdrs("x-a", "1")},
		{"sec9.4/duplicate_keeps_position", "x-a: 1\nx-b: 2\nx-a: 3\n", hdrs("x-a", "3", "x-b", "2")},
		{"sec9.4/name_lowercased", "Content-Type: TEXT\n", hdrs("content-type", "TEXT")},
		{"sec9.4/invalid_utf8_replaced", "x-a: caf\xc3\nx-\xff: \xe2\x82\xac\xe2\x82\n", hdrs("x-a", "caf\ufffd", "x-\ufffd", "€\ufffd")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := []byte("the payload")
			checkDecode(t, []byte(frame(rs1Prefix, []byte(tt.block), payload)), tt.want, payload)
		})
	}
}

// TestDecodeRS2 covers the rs2 rules of settlement.md §9.4 that a
// well-formed block exercises.
func TestDecodeRS2(t *testing.T) {
	tests := []struct {
		name  string
		block []byte
		want  Headers
	}{
		{"sec9.4/empty_block", nil, nil},
		{"sec9.4/empty_name_and_value", rs2Block("", ""), hdrs("", "")},
		{"sec9.4/name_lowercased", rs2Block("X-A", "V"), hdrs("x-a", "V")},
		{"sec9.4/value_any_bytes", rs2Block("x-a", "\x00\xff\r\n "), hdrs("x-a", "\x00\xff\r\n ")},
		{"sec9.4/duplicate_keeps_position", rs2Block("x-a", "1", "x-b", "2", "X-A", "3"), hdrs("x-a", "3", "x-b", "2")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := []byte("the payload")
			checkDecode(t, []byte(frame(rs2Prefix, tt.block, payload)), tt.want, payload)
		})
	}
}

// TestDecodeManyHeaders checks that past the indexing threshold decoding
// still gives the result of Headers.Set: lowercased names, first position,
// last value.
func TestDecodeManyHeaders(t *testing.T) {
	for _, n := range []int{indexAfter - 1, indexAfter, indexAfter + 1, 5 * indexAfter} {
		var want Headers
		var rs1, rs2 []byte
		for i := range 3 * n {
			name := "X-H" + strconv.Itoa(i%n)
			value := strconv.Itoa(i)
			want.Set(name, []byte(value))
			rs1 = fmt.Appendf(rs1, "%s: %s\n", name, value)
			rs2 = append(rs2, rs2Block(name, value)...)
		}
		t.Run(fmt.Sprintf("sec9.4/rs1/%d_names", n), func(t *testing.T) {
			checkDecode(t, []byte(frame(rs1Prefix, rs1, []byte("p"))), want, []byte("p"))
		})
		t.Run(fmt.Sprintf("sec9.4/rs2/%d_names", n), func(t *testing.T) {
			checkDecode(t, []byte(frame(rs2Prefix, rs2, []byte("p"))), want, []byte("p"))
		})
	}
}

// TestDecodeOwnership checks that decoded values and the payload do not
// alias record, and that appending to one value leaves the rest intact.
func TestDecodeOwnership(t *testing.T) {
	for _, m := range []struct {
		name    string
		headers Headers
	}{
		{"rs1", hdrs("x-a", "1", "x-b", "2")},
		{"rs2", hdrs("x-a", "1 ", "x-b", "2 ")},
	} {
		t.Run("sec9.4/"+m.name, func(t *testing.T) {
			record := Encode(m.headers, []byte("payload"), false)
			h, p := Decode(record)
			_ = append(h[0].Value, "XXXXXXXXXXXX"...)
			checkDecode(t, record, m.headers, []byte("payload"))
			if !sameHeaders(h, m.headers) || string(p) != "payload" {
				t.Errorf("after appending to the first value: headers %s, payload %q", fmtHeaders(h), p)
			}
			for i := range record {
				record[i] = 0
			}
			if !sameHeaders(h, m.headers) || string(p) != "payload" {
				t.Errorf("after clearing the record: headers %s, payload %q", fmtHeaders(h), p)
			}
		})
	}
}

// TestSequenceOverridesEnvelope covers checklist item 48: the reader's
// sequence replaces one carried in the envelope, in place.
func TestSequenceOverridesEnvelope(t *testing.T) {
	record := Encode(hdrs("stream-sequence", "99", "x-tenant", "acme"), []byte("p"), false)
	h, _ := Decode(record)
	h.SetSequence(7)
	if want := hdrs("stream-sequence", "7", "x-tenant", "acme"); !sameHeaders(h, want) {
		t.Errorf("item48: headers = %s, want %s", fmtHeaders(h), fmtHeaders(want))
	}
}

// TestEncodeNameNotUTF8 checks that a name that is not UTF-8 is written with
// replacement characters, so the record still decodes.
func TestEncodeNameNotUTF8(t *testing.T) {
	h := Headers{{Name: "x-\xff\xfe-\xe2\x82", Value: []byte("v")}}
	record := Encode(h, []byte("p"), false)
	if !bytes.HasPrefix(record, []byte(rs2Prefix)) {
		t.Fatalf("Encode = %q, want the rs2 form", record)
	}
	checkDecode(t, record, hdrs("x-\ufffd\ufffd-\ufffd", "v"), []byte("p"))
}

// TestAppendEncode checks that AppendEncode keeps dst's contents and that
// Encode's result does not alias the payload.
func TestAppendEncode(t *testing.T) {
	for _, v := range vectors {
		for _, m := range modes(v.file, v.line) {
			t.Run(v.name+"/"+m.name, func(t *testing.T) {
				dst := []byte("prefix|")
				got := AppendEncode(dst[:len(dst):len(dst)], v.headers, []byte(v.payload), m.line)
				if want := "prefix|" + v.record; string(got) != want {
					t.Errorf("AppendEncode = %q, want %q", got, want)
				}
				payload := []byte(v.payload)
				if rec := Encode(v.headers, payload, m.line); len(rec) > 0 {
					rec[0] ^= 0xFF
					if string(payload) != v.payload {
						t.Errorf("Encode result aliases the payload")
					}
				}
			})
		}
	}
}

// TestEncodeBase64Boundary checks every alignment of the header block
// against the payload in the base64 text.
func TestEncodeBase64Boundary(t *testing.T) {
	for hl := range 6 {
		for pl := range 6 {
			t.Run(fmt.Sprintf("value_%d_payload_%d", hl, pl), func(t *testing.T) {
				h := hdrs("x", strings.Repeat("v", hl))
				payload := []byte(strings.Repeat("p", pl))
				block := fmt.Appendf(nil, "x: %s\n", strings.Repeat("v", hl))
				want := frame(rs1Prefix, block, payload)
				if got := Encode(h, payload, false); string(got) != want {
					t.Errorf("Encode = %q, want %q", got, want)
				}
			})
		}
	}
}

// TestLineSafety checks the line rule of settlement.md §9.1 for payloads
// without headers.
func TestLineSafety(t *testing.T) {
	tests := []struct {
		name      string
		payload   string
		enveloped bool
	}{
		{"item39/json", `{"id":7}`, false},
		{"item40/binary", "\x00\xff", true},
		{"item40/newline", "a\nb", true},
		{"item40/trailing_newline", "a\n", true},
		{"item40/leading_space", " a", true},
		{"item40/trailing_space", "a ", true},
		{"item40/trailing_nbsp", "a\u00a0", true},
		{"item40/only_cr", "\r", true},
		{"sec9.1/inner_cr", "a\rb", false},
		{"sec9.1/inner_space", "a b", false},
		{"sec9.1/empty", "", false},
		{"sec9.1/nul", "\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			payload := []byte(tt.payload)
			got := Encode(nil, payload, true)
			if enveloped := !bytes.Equal(got, payload); enveloped != tt.enveloped {
				t.Errorf("Encode(%q, line) = %q, enveloped %v, want %v", payload, got, enveloped, tt.enveloped)
			}
			if file := Encode(nil, payload, false); !bytes.Equal(file, payload) {
				t.Errorf("Encode(%q, file) = %q, want it verbatim", payload, file)
			}
			checkDecode(t, got, nil, payload)
		})
	}
}

func TestAppendLossy(t *testing.T) {
	const r = "\ufffd"
	tests := []struct {
		name, in, want string
	}{
		{"valid", "a€😀", "a€😀"},
		{"empty", "", ""},
		// The example of The Unicode Standard §3.9, Table 3-8.
		{"unicode_table_3_8", "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", "a" + r + r + r + "b" + r + "c" + r + r + "d"},
		{"lone_continuation", "\x80", r},
		{"invalid_run", "\xff\xfe", r + r},
		{"overlong_two_bytes", "\xc0\x80", r + r},
		{"overlong_three_bytes", "\xe0\x80\x80", r + r + r},
		{"truncated_three_bytes", "\xe2\x82", r},
		{"truncated_four_bytes_at_end", "x\xf0\x9f\x98", "x" + r},
		{"surrogate", "\xed\xa0\x80", r + r + r},
		{"above_max", "\xf4\x90\x80\x80", r + r + r + r},
		{"max", "\xf4\x8f\xbf\xbf", "\U0010FFFF"},
		{"f5", "\xf5\x80", r + r},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(appendLossy(nil, []byte(tt.in))); got != tt.want {
				t.Errorf("appendLossy([]byte(%q)) = %q, want %q", tt.in, got, tt.want)
			}
			if got := string(appendLossy([]byte("<"), tt.in)); got != "<"+tt.want {
				t.Errorf("appendLossy(%q) = %q, want %q", tt.in, got, "<"+tt.want)
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, bc := range benchCases() {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.payload))) // throughput in payload bytes
			var dst []byte
			for b.Loop() {
				dst = AppendEncode(dst[:0], bc.headers, bc.payload, bc.line)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, bc := range benchCases() {
		record := Encode(bc.headers, bc.payload, bc.line)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(record))) // throughput in record bytes
			for b.Loop() {
				Decode(record)
			}
		})
	}
}

type benchCase struct {
	name    string
	headers Headers
	payload []byte
	line    bool
}

func benchCases() []benchCase {
	payload := bytes.Repeat([]byte(`{"id":7,"name":"streamd"}`), 40) // 1000 bytes
	return []benchCase{
		{"plain_1000B", nil, payload, true},
		{"rs1_1000B", hdrs("stream-sequence", "12345", "x-ruststream-retry-count", "2", "x-tenant", "acme"), payload, false},
		{"rs2_1000B", hdrs("stream-sequence", "12345", "x-note", "two\nlines"), payload, false},
	}
}

// TestParseHeader: name=value, the value may hold '=' and be empty; no
// '=' or an empty name is an error that says how to write it.
func TestParseHeader(t *testing.T) {
	for _, tc := range []struct{ text, name, value, err string }{
		{"tenant=acme", "tenant", "acme", ""},
		{"q=a=b", "q", "a=b", ""},
		{"empty=", "empty", "", ""},
		{"tenant", "", "", `header "tenant" has no '=': write name=value`},
		{"=v", "", "", `header "=v" has an empty name`},
	} {
		name, value, err := ParseHeader(tc.text)
		if name != tc.name || string(value) != tc.value || fmt.Sprint(err) != cmp.Or(tc.err, "<nil>") {
			t.Errorf("ParseHeader(%q) = %q, %q, %v; want %q, %q, %q", tc.text, name, value, err, tc.name, tc.value, tc.err)
		}
	}
}
