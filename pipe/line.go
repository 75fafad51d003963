package pipe

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// Line is one parsed line of the stdio format. It holds only what the line
// says; [Sequencer.Assign] supplies the defaults for what it leaves out.
type Line struct {
	// Timestamp is the timestamp given in the header, in UTC, when
	// HasTimestamp is set. The Rust consumer uses the time of reading
	// otherwise.
	Timestamp time.Time
	// StreamKey is the stream key given in the header, when HasStreamKey is
	// set. It is 1 to 249 bytes of [A-Za-z0-9._-] and aliases the parsed line.
	StreamKey []byte
	// Sequence is the sequence number given in the header, when HasSequence
	// is set.
	Sequence uint64
	// ShardID is the shard id given in the header, when HasShardID is set.
	ShardID uint64
	// Payload is the message payload. It aliases the parsed line and may be
	// empty, but it is never nil unless the line was.
	Payload []byte

	// HasHeader reports whether the line starts with a header. If it is
	// false, the other Has fields are false and Payload is the whole line.
	HasHeader bool
	// HasTimestamp reports whether the header gives a timestamp. A flag is
	// needed because 0001-01-01T00:00:00 is a valid timestamp and equals the
	// zero [time.Time].
	HasTimestamp bool
	// HasStreamKey reports whether the header gives a stream key.
	HasStreamKey bool
	// HasSequence reports whether the header gives a sequence number. It
	// implies HasStreamKey.
	HasSequence bool
	// HasShardID reports whether the header gives a shard id. It implies
	// HasSequence.
	HasShardID bool
}

// LineError reports a line whose header has a part that no rule accepts. The
// Rust consumer aborts the process on such a line.
type LineError struct {
	// Part is the offending header part, trimmed of whitespace. It is empty
	// for an empty part, as in "[k |]" or "[ ]".
	Part string
	// Reason says why the part was not accepted at its position.
	Reason string
}

// Error returns the offending part and the reason, without a line number.
// A part longer than maxQuotedPart bytes (a JSON array taken for a
// header, say) is cut there, its length said, so that it does not flood
// the log.
func (e *LineError) Error() string {
	part := strconv.Quote(e.Part)
	if len(e.Part) > maxQuotedPart {
		cut := maxQuotedPart
		for cut > 0 && !utf8.RuneStart(e.Part[cut]) {
			cut--
		}
		part = strconv.Quote(e.Part[:cut]) + "... (" + strconv.Itoa(len(e.Part)) + " bytes)"
	}
	return "invalid header part " + part + ": " + e.Reason
}

// maxQuotedPart is how much of an offending part LineError's text quotes.
const maxQuotedPart = 64

// ErrInvalidUTF8 is matched, with [errors.Is], by the error [ParseLine]
// returns for a line that is not valid UTF-8. The Rust consumer fails to read
// such a line and aborts the process.
var ErrInvalidUTF8 = errors.New("line is not valid UTF-8")

// ParseLine parses one line of the stdio format. The caller removes the
// trailing '\n' and nothing else: a '\r' is part of the line, and a '\n'
// inside line is treated as an ordinary whitespace character.
//
// ParseLine does not allocate unless it fails. The returned
// [Line.StreamKey] and [Line.Payload] alias line; copy them before line is
// modified or reused.
//
// A line that is not valid UTF-8 yields an error wrapping [ErrInvalidUTF8].
// A line with a header that is not valid yields a [*LineError].
func ParseLine(line []byte) (Line, error) {
	if !utf8.Valid(line) {
		return Line{}, invalidUTF8(line)
	}
	header, rest, ok := cutHeader(line)
	if !ok {
		return Line{Payload: line}, nil
	}
	l := Line{HasHeader: true}
	for {
		piece := header
		i := bytes.IndexByte(header, '|')
		if i >= 0 {
			piece = header[:i]
		}
		if err := l.assign(bytes.TrimSpace(piece)); err != nil {
			return Line{}, err
		}
		if i < 0 {
			break
		}
		header = header[i+1:]
	}
	// Rust slices the payload at the start of rest.trim(). For a remainder
	// that is empty or only whitespace, trim returns an empty string at the
	// start of rest, so the whitespace is delivered unchanged.
	l.Payload = rest
	if p := bytes.TrimLeftFunc(rest, unicode.IsSpace); len(p) > 0 {
		l.Payload = p
	}
	return l, nil
}

// cutHeader splits line into the text between a leading '[' and the first
// ']', and the rest after that ']'. It reports false if the line has no
// header: no '[' at the first byte, no ']' after it, or nothing in between.
func cutHeader(line []byte) (header, rest []byte, ok bool) {
	if len(line) == 0 || line[0] != '[' {
		return nil, nil, false
	}
	end := bytes.IndexByte(line[1:], ']')
	if end < 1 {
		return nil, nil, false
	}
	return line[1 : 1+end], line[2+end:], true
}

// assign applies the part assignment rules of spec §2.3 to one trimmed part,
// in the order of the Rust parser.
func (l *Line) assign(part []byte) *LineError {
	if !l.HasTimestamp && !l.HasStreamKey {
		if ts, reason := parseTimestamp(part); reason == "" {
			l.Timestamp, l.HasTimestamp = ts, true
			return nil
		}
	}
	if !l.HasStreamKey && validStreamKey(part) {
		l.StreamKey, l.HasStreamKey = part, true
		return nil
	}
	if l.HasStreamKey && !l.HasSequence {
		if n, reason := parseUint64(part); reason == "" {
			l.Sequence, l.HasSequence = n, true
			return nil
		}
	}
	if l.HasSequence && !l.HasShardID {
		if n, reason := parseUint64(part); reason == "" {
			l.ShardID, l.HasShardID = n, true
			return nil
		}
	}
	return &LineError{Part: string(part), Reason: l.rejectReason(part)}
}

// rejectReason explains why assign found no rule for part, given the fields
// assigned so far.
func (l *Line) rejectReason(part []byte) string {
	_, tsReason := parseTimestamp(part)
	switch {
	case len(part) == 0:
		return "empty part"
	case !l.HasTimestamp && !l.HasStreamKey:
		return fmt.Sprintf("neither a timestamp (%s) nor a stream key (%s)", tsReason, streamKeyReason(part))
	case tsReason == "":
		return "a timestamp is only accepted as the first part"
	case !l.HasStreamKey:
		return "not a stream key: " + streamKeyReason(part)
	case !l.HasSequence:
		_, reason := parseUint64(part)
		return "not a sequence number: " + reason
	case !l.HasShardID:
		_, reason := parseUint64(part)
		return "not a shard id: " + reason
	default:
		return "too many parts: stream key, sequence and shard id are already given"
	}
}

// invalidUTF8 returns the error for a line that utf8.Valid rejected, with the
// offset of the first bad byte.
func invalidUTF8(line []byte) error {
	off := 0
	for off < len(line) {
		r, size := utf8.DecodeRune(line[off:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		off += size
	}
	return fmt.Errorf("%w: bad byte at offset %d", ErrInvalidUTF8, off)
}
