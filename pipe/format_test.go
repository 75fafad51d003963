package pipe

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestAppendProducerLine checks the exact form the Rust producer prints.
func TestAppendProducerLine(t *testing.T) {
	tests := []struct {
		name    string
		ts      time.Time
		key     string
		seq     uint64
		payload string
		want    string
	}{
		{"spec example", time.Date(2023, 2, 24, 8, 13, 10, 0, time.UTC), "relay", 0, `{"relay":1,"tick":0}`, "[2023-02-24T08:13:10 | relay | 0] {\"relay\":1,\"tick\":0}\n"},
		{"converted to UTC and truncated", time.Date(2023, 1, 1, 0, 30, 0, 999999999, time.FixedZone("", -3600)), "k", 1, "x", "[2023-01-01T01:30:00 | k | 1] x\n"},
		{"maximum sequence", time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC), "k", 18446744073709551615, "x", "[2023-01-01T00:00:00 | k | 18446744073709551615] x\n"},
		{"payload verbatim", time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC), "broadcast", 2, " a\nb ", "[2023-01-01T00:00:00 | broadcast | 2]  a\nb \n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendProducerLine([]byte(">"), tt.ts, tt.key, tt.seq, []byte(tt.payload))
			if string(got) != ">"+tt.want {
				t.Errorf("got %q, want %q", got, ">"+tt.want)
			}
		})
	}
}

// TestMaxProducerHeaderLen: the header of a line with the longest key and
// sequence, in the last second of year 9999, is MaxProducerHeaderLen long.
func TestMaxProducerHeaderLen(t *testing.T) {
	line := AppendProducerLine(nil, time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), strings.Repeat("k", MaxStreamKeyLen), math.MaxUint64, []byte("p"))
	if n := len(line) - len("p\n"); n != MaxProducerHeaderLen {
		t.Errorf("header of %d bytes (%q), want %d", n, line, MaxProducerHeaderLen)
	}
}

// TestProducerErrors checks that rejected sends print nothing and consume no
// sequence number.
func TestProducerErrors(t *testing.T) {
	now := time.Date(2023, 1, 1, 0, 0, 0, 0, time.UTC)
	var p Producer
	tests := []struct {
		name    string
		key     string
		payload string
		err     string
	}{
		{"invalid UTF-8", "k", "\xff", "payload is not valid UTF-8"},
		{"empty key", "", "x", `invalid stream key "": empty`},
		{"bad key character", "a b", "x", `invalid stream key "a b": character ' ' is not allowed`},
		{"key too long", strings.Repeat("k", 250), "x", "250 characters, longer than 249"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, printed, err := p.Append([]byte(">"), now, tt.key, []byte(tt.payload))
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("error = %v, want it to contain %q", err, tt.err)
			}
			if printed || string(got) != ">" {
				t.Errorf("printed %v %q, want nothing", printed, got)
			}
		})
	}
	got, printed, err := p.Append(nil, now, "k", []byte("x"))
	if err != nil || !printed || string(got) != "[2023-01-01T00:00:00 | k | 0] x\n" {
		t.Errorf("first printed line = %q, %v, %v; want sequence 0", got, printed, err)
	}
	longest := strings.Repeat("k", MaxStreamKeyLen)
	if _, printed, err := p.Append(nil, now, longest, []byte("x")); err != nil || !printed {
		t.Errorf("%d-character key: printed %v, %v", MaxStreamKeyLen, printed, err)
	}
}

// TestAppendLogLine checks the ss-decode log form and that it parses back to
// the same fields.
func TestAppendLogLine(t *testing.T) {
	day := func(nanos int) time.Time { return time.Date(2023, 6, 5, 13, 55, 53, nanos, time.UTC) }
	tests := []struct {
		name    string
		ts      time.Time
		payload string
		want    string
	}{
		{"milliseconds", day(1000000), "message-1", "[2023-06-05T13:55:53.001 | hello | 1 | 0] message-1\n"},
		{"two digits", day(120000000), "x", "[2023-06-05T13:55:53.12 | hello | 1 | 0] x\n"},
		{"whole second", day(0), "x", "[2023-06-05T13:55:53.0 | hello | 1 | 0] x\n"},
		{"nanoseconds", day(123456789), "x", "[2023-06-05T13:55:53.123456789 | hello | 1 | 0] x\n"},
		{"other zone", time.Date(2023, 6, 5, 15, 55, 53, 500000000, time.FixedZone("CEST", 7200)), "x", "[2023-06-05T13:55:53.5 | hello | 1 | 0] x\n"},
		{"negative year", time.Date(-44, 3, 15, 12, 0, 0, 0, time.UTC), "x", "[-0044-03-15T12:00:00.0 | hello | 1 | 0] x\n"},
		{"binary payload", day(0), "\x00\xff", "[2023-06-05T13:55:53.0 | hello | 1 | 0] <BINARY BLOB>\n"},
		{"empty payload", day(0), "", "[2023-06-05T13:55:53.0 | hello | 1 | 0] \n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendLogLine([]byte(">"), tt.ts, "hello", 1, 0, []byte(tt.payload))
			if string(got) != ">"+tt.want {
				t.Fatalf("got %q, want %q", got, ">"+tt.want)
			}
			l, err := ParseLine(got[1 : len(got)-1])
			if err != nil {
				t.Fatal(err)
			}
			if !l.HasTimestamp || !l.Timestamp.Equal(tt.ts) || string(l.StreamKey) != "hello" ||
				!l.HasSequence || l.Sequence != 1 || !l.HasShardID || l.ShardID != 0 {
				t.Errorf("parsed back as %+v", l)
			}
		})
	}
}
