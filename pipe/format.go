package pipe

import (
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// secondsLayout is the timestamp form the Rust stdio producer prints: UTC,
// whole seconds, no zone.
const secondsLayout = "2006-01-02T15:04:05"

// binaryBlob replaces a payload that is not UTF-8 in the log form.
const binaryBlob = "<BINARY BLOB>"

// MaxProducerHeaderLen is the length of the longest header
// [AppendProducerLine] writes before a payload, for a year from 0 to 9999:
// the longest stream key and sequence number, and the space after the ']'.
const MaxProducerHeaderLen = len("[0000-00-00T00:00:00 | ") + MaxStreamKeyLen + len(" | 18446744073709551615] ")

// AppendProducerLine appends to dst the line the Rust stdio producer prints
// for one message and returns the extended buffer:
//
//	[YYYY-MM-DDTHH:MM:SS | key | seq] payload\n
//
// The timestamp is ts in UTC, truncated to the second. The payload is copied
// verbatim, with no escaping or trimming, so a '\n' in it yields more than
// one line. AppendProducerLine does not validate its arguments; [Producer]
// does. The year of ts should lie within -9999 to 9999, which the format can
// express.
func AppendProducerLine(dst []byte, ts time.Time, key string, seq uint64, payload []byte) []byte {
	dst = append(dst, '[')
	dst = ts.UTC().AppendFormat(dst, secondsLayout)
	dst = append(dst, " | "...)
	dst = append(dst, key...)
	dst = append(dst, " | "...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, "] "...)
	dst = append(dst, payload...)
	return append(dst, '\n')
}

// AppendLogLine appends to dst the line `ss-decode --format log` prints for
// one message of a .ss file and returns the extended buffer:
//
//	[YYYY-MM-DDTHH:MM:SS.F | key | seq | shard] payload\n
//
// The timestamp is ts in UTC with the shortest fraction that is exact, but
// at least one digit (".001", ".12", ".0"). A payload that is not valid UTF-8
// is replaced by "<BINARY BLOB>"; any other payload is copied verbatim, and
// an empty one leaves a trailing space, as in ss-decode. With a valid stream
// key and a year from -9999 to 9999, the line is valid stdio input that
// preserves all four fields; see the package documentation for the payloads
// that do not come back unchanged.
func AppendLogLine(dst []byte, ts time.Time, key string, seq, shard uint64, payload []byte) []byte {
	ts = ts.UTC()
	dst = append(dst, '[')
	dst = ts.AppendFormat(dst, secondsLayout)
	dst = appendFraction(dst, ts.Nanosecond())
	dst = append(dst, " | "...)
	dst = append(dst, key...)
	dst = append(dst, " | "...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, " | "...)
	dst = strconv.AppendUint(dst, shard, 10)
	dst = append(dst, "] "...)
	if utf8.Valid(payload) {
		dst = append(dst, payload...)
	} else {
		dst = append(dst, binaryBlob...)
	}
	return append(dst, '\n')
}

// appendFraction appends '.' and the nanoseconds as a decimal fraction with
// trailing zeros removed, keeping at least one digit.
func appendFraction(dst []byte, nanos int) []byte {
	var digits [9]byte
	for i := len(digits) - 1; i >= 0; i-- {
		digits[i] = byte('0' + nanos%10)
		nanos /= 10
	}
	n := len(digits)
	for n > 1 && digits[n-1] == '0' {
		n--
	}
	dst = append(dst, '.')
	return append(dst, digits[:n]...)
}

// Producer numbers and formats outgoing messages as the Rust stdio producer
// does: one sequence counter per stream key (not per shard), starting at 0
// and consumed only by printed lines.
//
// The zero value is ready to use. A Producer is not safe for concurrent use;
// the Rust producer serialises all sends of a process through one thread, and
// a caller that shares a Producer must do the same.
type Producer struct {
	next map[string]uint64
}

// Append appends the line for one message on stream key to dst, timestamped
// now, and reports whether it printed anything. An empty payload prints
// nothing and consumes no sequence number, which is not an error: the Rust
// producer drops such messages silently (its flush relies on that). An
// invalid stream key or a payload that is not valid UTF-8 is an error, and
// dst is returned unchanged.
func (p *Producer) Append(dst []byte, now time.Time, key string, payload []byte) (line []byte, printed bool, err error) {
	if !validStreamKey(key) {
		return dst, false, fmt.Errorf("invalid stream key %q: %s", key, streamKeyReason(key))
	}
	if !utf8.Valid(payload) {
		return dst, false, errors.New("payload is not valid UTF-8")
	}
	if len(payload) == 0 {
		return dst, false, nil
	}
	if p.next == nil {
		p.next = make(map[string]uint64)
	}
	seq := p.next[key]
	p.next[key] = seq + 1
	return AppendProducerLine(dst, now, key, seq, payload), true, nil
}
