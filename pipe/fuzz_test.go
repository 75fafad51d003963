package pipe

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
	"unicode"
)

// FuzzParseLine checks that ParseLine never panics, that its results are
// consistent, and that every accepted line with a header survives being
// formatted again and re-parsed:
//
//   - The header is rebuilt from the fields present, in the order timestamp
//     (9 fraction digits), stream key, sequence, shard id, followed by "] "
//     and the payload. It must parse back to the same fields.
//   - The payload P comes back unchanged if it is non-empty and does not
//     start with a White_Space character. If P is empty or only whitespace,
//     it comes back as " "+P (the separator space is kept). Otherwise it
//     comes back with its leading whitespace removed.
//   - If all four fields are present, the same holds for [AppendLogLine]
//     (shortest fraction) whenever the payload is valid UTF-8, which it is.
func FuzzParseLine(f *testing.F) {
	for _, name := range []string{"valid.txt", "invalid.txt", "crlf.txt", "invalid-utf8.txt"} {
		for _, line := range readLines(f, name) {
			f.Add(line)
		}
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		l, err := ParseLine(line)
		if err != nil {
			checkRejected(t, line, err)
			return
		}
		if !bytes.HasSuffix(line, l.Payload) {
			t.Fatalf("payload %q is not a suffix of %q", l.Payload, line)
		}
		if !l.HasHeader {
			if len(l.Payload) != len(line) || l.HasTimestamp || l.HasStreamKey || l.HasSequence || l.HasShardID {
				t.Fatalf("line without header parsed as %+v", l)
			}
			return
		}
		if !l.HasTimestamp && !l.HasStreamKey || l.HasSequence && !l.HasStreamKey || l.HasShardID && !l.HasSequence {
			t.Fatalf("invalid field combination %+v", l)
		}
		want := survivingPayload(l.Payload)
		checkRoundTrip(t, "formatted", appendHeader(nil, &l), l, want)
		if l.HasTimestamp && l.HasStreamKey && l.HasSequence && l.HasShardID {
			b := AppendLogLine(nil, l.Timestamp, string(l.StreamKey), l.Sequence, l.ShardID, l.Payload)
			checkRoundTrip(t, "log line", b[:len(b)-1], l, want)
		}
	})
}

// checkRejected checks the error of a rejected line.
func checkRejected(t *testing.T, line []byte, err error) {
	t.Helper()
	var le *LineError
	switch {
	case errors.Is(err, ErrInvalidUTF8):
	case errors.As(err, &le):
		header, _, ok := cutHeader(line)
		if !ok || !bytes.Contains(header, []byte(le.Part)) {
			t.Fatalf("%q: error %v names a part that is not in the header", line, err)
		}
	default:
		t.Fatalf("%q: unexpected error type %T: %v", line, err, err)
	}
}

// survivingPayload returns what a downstream parser makes of payload p
// written after "] ".
func survivingPayload(p []byte) []byte {
	if rest := bytes.TrimLeftFunc(p, unicode.IsSpace); len(rest) > 0 {
		return rest
	}
	return append([]byte{' '}, p...)
}

// appendHeader formats the fields present in l, with a 9-digit fraction,
// followed by "] " and the payload.
func appendHeader(dst []byte, l *Line) []byte {
	sep := "["
	if l.HasTimestamp {
		dst = append(dst, sep...)
		dst = l.Timestamp.UTC().AppendFormat(dst, "2006-01-02T15:04:05.000000000")
		sep = " | "
	}
	if l.HasStreamKey {
		dst = append(dst, sep...)
		dst = append(dst, l.StreamKey...)
		sep = " | "
	}
	if l.HasSequence {
		dst = append(dst, sep...)
		dst = strconv.AppendUint(dst, l.Sequence, 10)
	}
	if l.HasShardID {
		dst = append(dst, sep...)
		dst = strconv.AppendUint(dst, l.ShardID, 10)
	}
	dst = append(dst, "] "...)
	return append(dst, l.Payload...)
}

// checkRoundTrip parses b and compares it with the fields of orig and the
// expected payload.
func checkRoundTrip(t *testing.T, what string, b []byte, orig Line, payload []byte) {
	t.Helper()
	got, err := ParseLine(b)
	if err != nil {
		t.Fatalf("%s %q: %v", what, b, err)
	}
	if !got.HasHeader ||
		got.HasTimestamp != orig.HasTimestamp || !got.Timestamp.Equal(orig.Timestamp) ||
		got.HasStreamKey != orig.HasStreamKey || !bytes.Equal(got.StreamKey, orig.StreamKey) ||
		got.HasSequence != orig.HasSequence || got.Sequence != orig.Sequence ||
		got.HasShardID != orig.HasShardID || got.ShardID != orig.ShardID {
		t.Fatalf("%s %q: fields %+v, want %+v", what, b, got, orig)
	}
	if !bytes.Equal(got.Payload, payload) {
		t.Fatalf("%s %q: payload %q, want %q", what, b, got.Payload, payload)
	}
}
