package tail

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// Start is where a [Follower] begins in a file for which it has no stored
// position. The zero Start is the beginning of the file.
type Start struct {
	kind  startKind
	seq   uint64    // startSeq
	after time.Time // startTime
	off   int64     // startOffset
}

type startKind uint8

const (
	startBeginning startKind = iota
	startEnd
	startSeq
	startTime
	startOffset
)

// ParseStart parses a start position as written in configs and on the
// command line:
//
//	beginning      the first frame of the file
//	end            after the last complete frame present when following starts
//	seq:N          the first frame of the key with sequence N or higher
//	time:RFC3339   the first frame of the key with a timestamp strictly after the time
//	offset:N       the frame at byte offset N, which must be a frame boundary
//
// seq: and time: need [Options.Key]; offset: is checked against the file
// when the follower starts. The words match whatever their case, as the
// words of every configuration key do; the arguments are taken as written.
func ParseStart(s string) (Start, error) {
	switch strings.ToLower(s) {
	case "beginning":
		return Start{}, nil
	case "end":
		return Start{kind: startEnd}, nil
	}
	kind, arg, _ := strings.Cut(s, ":")
	switch strings.ToLower(kind) {
	case "seq":
		n, err := strconv.ParseUint(arg, 10, 64)
		if err != nil {
			return Start{}, fmt.Errorf("start position %q: the sequence number must be a decimal integer from 0 to %d", s, uint64(1<<64-1))
		}
		return Start{kind: startSeq, seq: n}, nil
	case "time":
		t, err := time.Parse(time.RFC3339, arg)
		if err != nil {
			return Start{}, fmt.Errorf("start position %q: the time must be RFC 3339, like 2025-03-01T12:00:00Z: %w", s, err)
		}
		if t.Before(time.UnixMilli(0)) {
			return Start{}, fmt.Errorf("start position %q: the time is before 1970-01-01T00:00:00Z, where frame timestamps begin", s)
		}
		return Start{kind: startTime, after: t}, nil
	case "offset":
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < streamfile.HeaderSize {
			return Start{}, fmt.Errorf("start position %q: the offset must be a decimal byte offset of at least %d (the end of the header)", s, streamfile.HeaderSize)
		}
		return Start{kind: startOffset, off: n}, nil
	}
	return Start{}, fmt.Errorf("start position %q: want %s", s, StartForms)
}

// StartForms lists the forms of a start position, for messages.
const StartForms = "beginning, end, seq:N, time:RFC3339 or offset:N"

// UnmarshalText parses a start position, as [ParseStart] does, so that a
// Start can be read from a configuration file.
func (s *Start) UnmarshalText(text []byte) error {
	v, err := ParseStart(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalText writes s as [Start.String] does, so that a Start can be a
// command-line value.
func (s Start) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// IsEnd reports whether s is the end of the file.
func (s Start) IsEnd() bool { return s.kind == startEnd }

// IsPlace reports whether s names a place in the file (beginning, end,
// offset:N), which a [Follower] has reached once New returns, rather than
// a record to look for (seq:N, time:T).
func (s Start) IsPlace() bool {
	return s.kind == startBeginning || s.kind == startEnd || s.kind == startOffset
}

// String returns s in the form [ParseStart] reads.
func (s Start) String() string {
	switch s.kind {
	case startEnd:
		return "end"
	case startSeq:
		return "seq:" + strconv.FormatUint(s.seq, 10)
	case startTime:
		return "time:" + s.after.UTC().Format(time.RFC3339Nano)
	case startOffset:
		return "offset:" + strconv.FormatInt(s.off, 10)
	}
	return "beginning"
}

// needsKey reports whether s seeks for frames of a stream key.
func (s Start) needsKey() bool { return s.kind == startSeq || s.kind == startTime }

// target is the seek target of a seq: or time: start.
func (s Start) target(key string) streamfile.Target {
	if s.kind == startSeq {
		return streamfile.Target{Key: key, BySeq: true, Seq: s.seq}
	}
	// Frames carry whole milliseconds: a frame is strictly after the time
	// exactly when it is after the millisecond the time falls in.
	return streamfile.Target{Key: key, AfterMs: uint64(s.after.UnixMilli())}
}

// resolve returns the offset where reading starts in a file of the given
// size. When a seek finds no frame yet, it returns the end of the data and
// the target, so that the frames before the first one that reaches it are
// passed over as they arrive.
func (s Start) resolve(r io.ReaderAt, h streamfile.Header, size int64, key string) (int64, *streamfile.Target, error) {
	switch s.kind {
	case startEnd:
		off, err := streamfile.End(r, h, size)
		if err != nil {
			return 0, nil, err
		}
		// A stream that ended stays ended: start at its end-of-stream
		// frame. Starting after it would go wrong when a writer continues
		// the file, as writers overwrite that frame (spec §10).
		eos, err := eosBefore(r, h, off)
		return eos, nil, err
	case startSeq, startTime:
		t := s.target(key)
		off, err := streamfile.Seek(r, h, size, t)
		if errors.Is(err, streamfile.ErrNotFound) {
			end, err := streamfile.End(r, h, size)
			return end, &t, err
		}
		return off, nil, err
	case startOffset:
		if err := checkBoundary(r, h, size, s.off); err != nil {
			return 0, nil, err
		}
		// As for end: writers overwrite an end-of-stream frame, which
		// would put an offset after it inside their first frame.
		eos, err := eosBefore(r, h, s.off)
		if err == nil && eos != s.off {
			err = fmt.Errorf("offset %d is right after the end-of-stream frame at %d, which a writer that continues the file overwrites, leaving offset %d inside a frame: use offset:%d, where end starts", s.off, eos, s.off, eos)
		}
		return s.off, nil, err
	}
	return streamfile.HeaderSize, nil, nil
}

// Offset resolves s to the frame boundary where reading would start in a
// file of the given size, for tools that store a position (streamd offsets
// set). Unlike a follower, which waits for a seq: or time: target that no
// frame reaches yet, it refuses such a target.
func (s Start) Offset(r io.ReaderAt, h streamfile.Header, size int64, key string) (int64, error) {
	off, pending, err := s.resolve(r, h, size, key)
	if err == nil && pending != nil {
		return 0, fmt.Errorf("no record of key %q reaches %s in the file yet", key, s)
	}
	return off, err
}

// reached reports whether a frame is at or past t, as [streamfile.Seek]
// decides it.
func reached(t *streamfile.Target, rec *streamfile.Record) bool {
	if rec.Key != t.Key {
		return false
	}
	if t.BySeq {
		return rec.Seq >= t.Seq
	}
	return rec.TimestampMs > t.AfterMs
}

// checkBoundary reports why off is not a place where a decoder can start in
// a file of the given size: the end of the header, the start or the end of
// a complete frame, or the position after a beacon at the end of the data.
// It reads from the last beacon before off, never the whole file.
func checkBoundary(r io.ReaderAt, h streamfile.Header, size, off int64) error {
	if off == streamfile.HeaderSize {
		return nil
	}
	if off < streamfile.HeaderSize {
		return fmt.Errorf("offset %d is inside the %d-byte header", off, streamfile.HeaderSize)
	}
	if off > size {
		return fmt.Errorf("offset %d is past the end of the file (%d bytes)", off, size)
	}
	from, err := boundaryBefore(r, h, off)
	if err != nil {
		return fmt.Errorf("offset %d: %w", off, err)
	}
	if from == off {
		return nil
	}
	d := streamfile.NewDecoder(r, h, from)
	d.ReadSize = int(min(int64(h.BeaconInterval), 256<<10))
	prevEnd := from
	for {
		start, end := int64(-1), int64(-1)
		rec, err := d.Next()
		var ce *streamfile.ChecksumError
		var fe *streamfile.FormatError
		switch {
		case err == nil:
			start, end = rec.Offset, rec.End
		case errors.As(err, &ce):
			start, end = ce.Offset, ce.End
		case errors.Is(err, io.EOF):
			if d.Pos() == off {
				return nil
			}
			return fmt.Errorf("offset %d is not a frame boundary: it lies in the beacon after the last frame, which ends at %d", off, prevEnd)
		case errors.Is(err, streamfile.ErrTruncated):
			return fmt.Errorf("offset %d is not a frame boundary: it lies in the incomplete frame at %d", off, d.Pos())
		case errors.Is(err, streamfile.ErrEndOfStream):
			return fmt.Errorf("offset %d is after the end-of-stream frame, which ends at %d", off, prevEnd)
		case errors.As(err, &fe):
			// Damage a follower skips: go on where it does.
			if ok, serr := d.SkipDamage(fe, size); serr != nil || !ok || d.Pos() > off {
				return fmt.Errorf("offset %d: %w", off, err)
			}
			if d.Pos() == off {
				return nil
			}
			prevEnd = d.Pos()
			continue
		default:
			return fmt.Errorf("offset %d: %w", off, err)
		}
		switch {
		case start == off || end == off:
			return nil
		case start > off:
			return fmt.Errorf("offset %d is not a frame boundary: it lies in the beacon between the frames ending at %d and starting at %d", off, prevEnd, start)
		case end > off:
			return fmt.Errorf("offset %d is not a frame boundary: it lies inside the frame at %d, which ends at %d", off, start, end)
		}
		prevEnd = end
	}
}

// boundaryBefore returns a frame boundary at or before off, found through
// the last beacon before it whose interrupted frame starts before off,
// stepping over damaged beacons (streamfile.CheckedBoundary).
func boundaryBefore(r io.ReaderAt, h streamfile.Header, off int64) (int64, error) {
	interval := int64(h.BeaconInterval)
	for b := off / interval * interval; b >= interval; b -= interval {
		p, err := streamfile.CheckedBoundary(r, h, b)
		var fe *streamfile.FormatError
		if err == nil && p <= off {
			return p, nil
		}
		if err != nil && !errors.Is(err, streamfile.ErrTruncated) && !errors.As(err, &fe) {
			return 0, fmt.Errorf("beacon at %d: %w", b, err)
		}
	}
	return streamfile.HeaderSize, nil
}

// eosBefore returns the offset of the last frame before end, a frame
// boundary, if that frame is an end-of-stream frame; otherwise end.
func eosBefore(r io.ReaderAt, h streamfile.Header, end int64) (int64, error) {
	eosSize := int64(len(streamfile.EOSKey) + len(streamfile.EOSPayload) + 32)
	if end-eosSize < streamfile.HeaderSize {
		return end, nil
	}
	from, err := boundaryBefore(r, h, end-eosSize)
	if err != nil {
		return 0, err
	}
	d := streamfile.NewDecoder(r, h, from)
	d.ReadSize = int(min(int64(h.BeaconInterval), 256<<10))
	for d.Pos() < end {
		rec, err := d.Next()
		var ce *streamfile.ChecksumError
		switch {
		case err == nil:
			if rec.End == end && rec.IsEOS() {
				return rec.Offset, nil
			}
		case errors.As(err, &ce):
		default:
			return end, nil
		}
	}
	return end, nil
}
