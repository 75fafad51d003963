package daemon

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// PositionKind says which record of a stream key a [Position] names.
type PositionKind int

// The kinds of [Position], each with the form it is written in.
const (
	PositionBeginning PositionKind = iota // "beginning": the first record retained
	PositionEnd                           // "end": after the last record; only new records
	PositionSeq                           // "seq:N": the first record with sequence N or more
	PositionTime                          // "time:RFC3339": the first record written strictly after the time
	PositionOffset                        // "offset:N": the frame at byte offset N of the file
)

// Position is where a subscription starts to read a stream key. Its zero
// value is the beginning.
type Position struct {
	Kind   PositionKind
	Seq    uint64    // for PositionSeq: 1 or more, as sequences start at 1
	Time   time.Time // for PositionTime: from 1970 to 9999, in milliseconds
	Offset int64     // for PositionOffset: at or after the file header
}

// positionForms lists the forms of a position, for error messages.
const positionForms = "beginning, end, seq:N, time:RFC3339 or offset:N"

// ParsePosition reads a position written beginning, end, seq:N,
// time:RFC3339 (such as time:2025-03-01T12:00:00Z) or offset:N.
func ParsePosition(s string) (Position, error) {
	p, err := parsePosition(s)
	if err != nil {
		return Position{}, fmt.Errorf("invalid position %q: %w", s, err)
	}
	return p, nil
}

func parsePosition(s string) (Position, error) {
	switch s {
	case "beginning":
		return Position{Kind: PositionBeginning}, nil
	case "end":
		return Position{Kind: PositionEnd}, nil
	}
	kind, arg, ok := strings.Cut(s, ":")
	if !ok {
		return Position{}, errors.New("use " + positionForms)
	}
	switch kind {
	case "seq":
		n, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || n == 0 {
			return Position{}, errors.New("a sequence is a decimal number from 1")
		}
		return Position{Kind: PositionSeq, Seq: n}, nil
	case "time":
		t, err := time.Parse(time.RFC3339Nano, arg)
		if err != nil {
			return Position{}, errors.New("write the time in RFC 3339, as in time:2025-03-01T12:00:00Z")
		}
		if t.Before(time.UnixMilli(0)) {
			return Position{}, errors.New("record timestamps start at 1970-01-01T00:00:00Z")
		}
		return Position{Kind: PositionTime, Time: t}, nil
	case "offset":
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < streamfile.HeaderSize {
			return Position{}, fmt.Errorf("an offset is a decimal number from %d, where the first frame can start", streamfile.HeaderSize)
		}
		return Position{Kind: PositionOffset, Offset: n}, nil
	}
	return Position{}, errors.New("use " + positionForms)
}

// UnmarshalText parses a position, as [ParsePosition] does.
func (p *Position) UnmarshalText(text []byte) error {
	v, err := ParsePosition(string(text))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// String writes p in the form [ParsePosition] reads.
func (p Position) String() string {
	switch p.Kind {
	case PositionEnd:
		return "end"
	case PositionSeq:
		return "seq:" + strconv.FormatUint(p.Seq, 10)
	case PositionTime:
		return "time:" + p.Time.Format(time.RFC3339Nano)
	case PositionOffset:
		return "offset:" + strconv.FormatInt(p.Offset, 10)
	}
	return "beginning"
}
