package pipe

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
)

// parsed is the expected result of a valid line in table tests. Absent
// fields are nil.
type parsed struct {
	header  bool
	ts      *time.Time
	key     *string
	seq     *uint64
	shard   *uint64
	payload string
}

func ptr[T any](v T) *T { return &v }

func utc(year int, month time.Month, day, hour, minute, second, nanos int) *time.Time {
	return ptr(time.Date(year, month, day, hour, minute, second, nanos, time.UTC))
}

// TestParseLine covers the consequences listed in spec §2.3 and further
// corner cases of §2.1, §2.2 and §2.4 that the vector files leave out.
func TestParseLine(t *testing.T) {
	ts := utc(2022, 1, 2, 3, 4, 5, 0)
	tests := []struct {
		name string
		line string
		want parsed
	}{
		// §2.3 consequences.
		{"numeric key alone", "[123] x", parsed{header: true, key: ptr("123"), payload: "x"}},
		{"numeric key after timestamp", "[2022-01-02T03:04:05 | 456] x", parsed{header: true, ts: ts, key: ptr("456"), payload: "x"}},
		{"numeric key, sequence, shard", "[1 | 2 | 3] x", parsed{header: true, key: ptr("1"), seq: ptr[uint64](2), shard: ptr[uint64](3), payload: "x"}},
		{"timestamp only", "[2022-01-02T03:04:05] 12345", parsed{header: true, ts: ts, payload: "12345"}},
		{"all four", "[2022-01-02T03:04:05 | k | 1 | 2] x", parsed{header: true, ts: ts, key: ptr("k"), seq: ptr[uint64](1), shard: ptr[uint64](2), payload: "x"}},

		// §2.2 timestamps.
		{"32 fraction digits", "[2022-01-02T03:04:05." + strings.Repeat("1", 32) + "] x", parsed{header: true, ts: utc(2022, 1, 2, 3, 4, 5, 111111111), payload: "x"}},
		{"fraction truncated not rounded", "[2022-01-02T03:04:05.9999999999] x", parsed{header: true, ts: utc(2022, 1, 2, 3, 4, 5, 999999999), payload: "x"}},
		{"one fraction digit", "[2022-01-02T03:04:05.5] x", parsed{header: true, ts: utc(2022, 1, 2, 3, 4, 5, 500000000), payload: "x"}},
		{"negative year", "[-0044-03-15T12:00:00] x", parsed{header: true, ts: utc(-44, 3, 15, 12, 0, 0, 0), payload: "x"}},
		{"year zero is a leap year", "[0000-02-29T00:00:00] x", parsed{header: true, ts: utc(0, 2, 29, 0, 0, 0, 0), payload: "x"}},
		{"2000 is a leap year", "[2000-02-29T00:00:00] x", parsed{header: true, ts: utc(2000, 2, 29, 0, 0, 0, 0), payload: "x"}},
		{"year one equals the zero time", "[0001-01-01T00:00:00] x", parsed{header: true, ts: utc(1, 1, 1, 0, 0, 0, 0), payload: "x"}},
		{"largest timestamp", "[9999-12-31T23:59:59.999999999] x", parsed{header: true, ts: utc(9999, 12, 31, 23, 59, 59, 999999999), payload: "x"}},

		// §2.2 stream keys and numbers.
		{"sequence with plus and zeros", "[k | +0007 | 00] x", parsed{header: true, key: ptr("k"), seq: ptr[uint64](7), shard: ptr[uint64](0), payload: "x"}},
		{"key of dots", "[...] x", parsed{header: true, key: ptr("..."), payload: "x"}},
		{"key that looks signed", "[-1] x", parsed{header: true, key: ptr("-1"), payload: "x"}},

		// §2.2 trimming uses the White_Space property.
		{"NEL trimmed", "[\u0085k\u0085] x", parsed{header: true, key: ptr("k"), payload: "x"}},
		{"ideographic space trimmed", "[\u3000k | 1\u3000] x", parsed{header: true, key: ptr("k"), seq: ptr[uint64](1), payload: "x"}},
		{"vertical tab and form feed trimmed", "[\vk\f]\v\fx", parsed{header: true, key: ptr("k"), payload: "x"}},
		{"newline inside the header trimmed", "[k\n| 1]x", parsed{header: true, key: ptr("k"), seq: ptr[uint64](1), payload: "x"}},

		// §2.1 recognition.
		{"empty line", "", parsed{payload: ""}},
		{"empty brackets", "[]", parsed{payload: "[]"}},
		{"no closing bracket", "[k x", parsed{payload: "[k x"}},
		{"leading space", " [k] x", parsed{payload: " [k] x"}},
		{"leading NBSP", "\u00a0[k] x", parsed{payload: "\u00a0[k] x"}},
		{"carriage return without header", "x\r", parsed{payload: "x\r"}},

		// §2.4 payload.
		{"no space after header", "[k]x", parsed{header: true, key: ptr("k"), payload: "x"}},
		{"nothing after header", "[k]", parsed{header: true, key: ptr("k"), payload: ""}},
		{"tab only after header", "[k]\t", parsed{header: true, key: ptr("k"), payload: "\t"}},
		{"NBSP only after header", "[k]\u00a0", parsed{header: true, key: ptr("k"), payload: "\u00a0"}},
		{"mixed whitespace only after header", "[k] \t\u3000\r", parsed{header: true, key: ptr("k"), payload: " \t\u3000\r"}},
		{"leading whitespace dropped, trailing kept", "[k] \u00a0 x \u00a0\r", parsed{header: true, key: ptr("k"), payload: "x \u00a0\r"}},
		{"zero-width space is not whitespace", "[k]\u200bx", parsed{header: true, key: ptr("k"), payload: "\u200bx"}},
		{"brackets and pipes in payload", "[k]] | [", parsed{header: true, key: ptr("k"), payload: "] | ["}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLine([]byte(tt.line))
			if err != nil {
				t.Fatalf("ParseLine(%q): %v", tt.line, err)
			}
			want := tt.want
			if got.HasHeader != want.header {
				t.Errorf("HasHeader = %v, want %v", got.HasHeader, want.header)
			}
			if got.HasTimestamp != (want.ts != nil) || want.ts != nil && !got.Timestamp.Equal(*want.ts) {
				t.Errorf("timestamp = %v %v, want %v", got.HasTimestamp, got.Timestamp, want.ts)
			}
			if got.HasStreamKey != (want.key != nil) || want.key != nil && string(got.StreamKey) != *want.key {
				t.Errorf("stream key = %v %q, want %v", got.HasStreamKey, got.StreamKey, jsonString(want.key))
			}
			if got.HasSequence != (want.seq != nil) || want.seq != nil && got.Sequence != *want.seq {
				t.Errorf("sequence = %v %d, want %v", got.HasSequence, got.Sequence, jsonString(want.seq))
			}
			if got.HasShardID != (want.shard != nil) || want.shard != nil && got.ShardID != *want.shard {
				t.Errorf("shard id = %v %d, want %v", got.HasShardID, got.ShardID, jsonString(want.shard))
			}
			if string(got.Payload) != want.payload {
				t.Errorf("payload = %q, want %q", got.Payload, want.payload)
			}
		})
	}
}

// TestParseLineInvalid covers invalid headers beyond invalid.txt, including
// the §2.3 consequences, and checks the offending part.
func TestParseLineInvalid(t *testing.T) {
	tests := []struct {
		name   string
		line   string
		part   string
		reason string // a substring of the reason
	}{
		// §2.3 consequences.
		{"timestamp after key", "[k | 2022-01-01T00:00:00] x", "2022-01-01T00:00:00", "first part"},
		{"timestamp after sequence", "[k | 1 | 2022-01-01T00:00:00] x", "2022-01-01T00:00:00", "first part"},
		{"second timestamp", "[2022-01-01T00:00:00|2022-01-01T00:00:00] x", "2022-01-01T00:00:00", "first part"},
		{"five parts", "[2022-01-01T00:00:00 | k | 1 | 2 | 3] x", "3", "too many parts"},
		{"four parts without timestamp", "[k | 1 | 2 | 3] x", "3", "too many parts"},
		{"plus-signed key after timestamp", "[2022-01-01T00:00:00 | +1] x", "+1", "not a stream key"},
		{"sequence without key", "[2022-01-01T00:00:00 | k.1 | 5 | 6 | 7]", "7", "too many parts"},

		// §2.2 timestamps.
		{"33 fraction digits", "[2022-01-02T03:04:05." + strings.Repeat("1", 33) + "] x", "2022-01-02T03:04:05." + strings.Repeat("1", 33), "more than 32 fraction digits"},
		{"month 13", "[2022-13-01T00:00:00] x", "2022-13-01T00:00:00", "month out of range"},
		{"month 0", "[2022-00-01T00:00:00] x", "2022-00-01T00:00:00", "month out of range"},
		{"day 0", "[2022-01-00T00:00:00] x", "2022-01-00T00:00:00", "day out of range"},
		{"April 31", "[2022-04-31T00:00:00] x", "2022-04-31T00:00:00", "day out of range"},
		{"1900 is not a leap year", "[1900-02-29T00:00:00] x", "1900-02-29T00:00:00", "day out of range"},
		{"minute 60", "[2022-01-01T00:60:00] x", "2022-01-01T00:60:00", "minute out of range"},
		{"five-digit year", "[12022-01-01T00:00:00] x", "12022-01-01T00:00:00", "expected '-' after the year"},
		{"sign without year", "[+-2022-01-01T00:00:00] x", "+-2022-01-01T00:00:00", "year must be 4 digits"},
		{"lowercase z", "[2022-01-01T00:00:00z] x", "2022-01-01T00:00:00z", "unexpected text"},
		{"fraction then zone", "[2022-01-01T00:00:00.5Z] x", "2022-01-01T00:00:00.5Z", "unexpected text"},
		{"non-ASCII digit", "[2022-01-01T00:00:0\u0661] x", "2022-01-01T00:00:0\u0661", "second must be 2 digits"},

		// §2.2 stream keys and numbers.
		{"bare plus as sequence", "[k | +] x", "+", "no digits"},
		{"plus plus", "[k | ++1] x", "++1", "not an unsigned decimal integer"},
		{"inner space", "[k | 1 2] x", "1 2", "not an unsigned decimal integer"},
		{"non-ASCII digits", "[k | \u0661] x", "\u0661", "not an unsigned decimal integer"},
		{"huge sequence", "[k | 99999999999999999999999] x", "99999999999999999999999", "larger than"},
		{"bare plus as first part", "[+] x", "+", "neither a timestamp"},

		// §2.2 trimming is White_Space only.
		{"U+180E is not whitespace", "[k\u180e] x", "k\u180e", "not allowed"},
		{"U+200B is not whitespace", "[\u200bk] x", "\u200bk", "not allowed"},
		{"U+001F is not whitespace", "[k\x1f] x", "k\x1f", "not allowed"},

		// §2.1: a recognised header is never demoted to a payload.
		{"JSON array", `["a", "b"]`, `"a", "b"`, "neither"},
		{"whitespace header", "[\t\u00a0]", "", "empty part"},
		{"lone separator", "[|]", "", "empty part"},
		{"carriage return in header", "[k\r|\r]", "", "empty part"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLine([]byte(tt.line))
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("ParseLine(%q) = %+v, %v; want a *LineError", tt.line, got, err)
			}
			if le.Part != tt.part {
				t.Errorf("part = %q, want %q", le.Part, tt.part)
			}
			if !strings.Contains(le.Reason, tt.reason) {
				t.Errorf("reason = %q, want it to contain %q", le.Reason, tt.reason)
			}
			if msg := le.Error(); !strings.Contains(msg, le.Reason) {
				t.Errorf("Error() = %q does not contain the reason", msg)
			}
		})
	}
}

// TestParseLineUTF8 checks that invalid UTF-8 anywhere is an error, also in
// lines without a header, and that the message gives the offset.
func TestParseLineUTF8(t *testing.T) {
	tests := []struct {
		line string
		msg  string
	}{
		{"\xff", "line is not valid UTF-8: bad byte at offset 0"},
		{"plain \xc3", "line is not valid UTF-8: bad byte at offset 6"},
		{"[k] \xed\xa0\x80", "line is not valid UTF-8: bad byte at offset 4"},
		{"[k\xc0\x80] x", "line is not valid UTF-8: bad byte at offset 2"},
	}
	for _, tt := range tests {
		_, err := ParseLine([]byte(tt.line))
		if !errors.Is(err, ErrInvalidUTF8) || err.Error() != tt.msg {
			t.Errorf("ParseLine(%q) error = %v, want %q", tt.line, err, tt.msg)
		}
	}
}

// TestParseLineAliases documents that StreamKey and Payload alias the input.
func TestParseLineAliases(t *testing.T) {
	line := []byte("[key | 1] payload")
	l, err := ParseLine(line)
	if err != nil {
		t.Fatal(err)
	}
	copy(line, "[KEY | 1] PAYLOAD")
	if string(l.StreamKey) != "KEY" || string(l.Payload) != "PAYLOAD" {
		t.Errorf("StreamKey %q, Payload %q: want them to alias the input", l.StreamKey, l.Payload)
	}
}

// TestWhiteSpace checks that the trimming ParseLine uses matches the Unicode
// White_Space property, which Rust's char::is_whitespace implements.
func TestWhiteSpace(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		ws := unicode.Is(unicode.White_Space, r)
		if unicode.IsSpace(r) != ws {
			t.Errorf("unicode.IsSpace(%U) = %v, White_Space = %v", r, !ws, ws)
		}
		if r >= 0xd800 && r <= 0xdfff {
			continue
		}
		part := "k" + string(r)
		if trimmed := bytes.TrimSpace([]byte(part)); (string(trimmed) == "k") != ws {
			t.Errorf("bytes.TrimSpace(%q) = %q, White_Space(%U) = %v", part, trimmed, r, ws)
		}
	}
}

// BenchmarkParseLine parses a typical 100-byte line with all four header
// fields.
func BenchmarkParseLine(b *testing.B) {
	line := []byte(`[2024-05-06T07:08:09.123456789 | orders.eu-1 | 1234567 | 3] {"id":98123,"status":"shipped","qty":12}`)
	if len(line) != 100 {
		b.Fatalf("benchmark line is %d bytes, want 100", len(line))
	}
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseLine(line); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLineErrorLongPart: the error of a long offending part quotes its
// first bytes, cut at a character boundary, and says its length; the part
// itself stays whole.
func TestLineErrorLongPart(t *testing.T) {
	long := strings.Repeat("a b", 1000)
	for _, tc := range []struct{ part, quoted string }{
		{"a b", `"a b"`},
		{long, `"` + long[:64] + `"... (3000 bytes)`},
		{strings.Repeat("x", 63) + "é" + long, `"` + strings.Repeat("x", 63) + `"... (3065 bytes)`},
	} {
		_, err := ParseLine([]byte("[" + tc.part + "] x"))
		le, ok := errors.AsType[*LineError](err)
		if !ok || le.Part != tc.part || !strings.HasPrefix(err.Error(), "invalid header part "+tc.quoted+": ") {
			t.Errorf("ParseLine of a %d-byte part: %v; want the part whole and the text to quote %s", len(tc.part), err, tc.quoted)
		}
	}
}
