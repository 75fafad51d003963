package streamfile

import (
	"cmp"
	"errors"
	"fmt"
	"io"
)

// ErrNotFound is returned by a seek whose target lies after every frame in
// the file.
var ErrNotFound = errors.New("streamfile: no frame at or after the seek target")

// Target selects the first frame of a stream key that a seek looks for.
type Target struct {
	Key string
	// Exactly one of the following applies: the first frame with sequence
	// at least Seq (BySeq), or the first frame with a timestamp strictly
	// after AfterMs.
	BySeq   bool
	Seq     uint64
	AfterMs uint64
}

// right reports whether a frame or marker with seq and ts is at or past the
// target.
func (t *Target) right(seq, ts uint64) bool {
	if t.BySeq {
		return seq >= t.Seq
	}
	return ts > t.AfterMs
}

// Seek returns the offset of the first frame of t.Key at or past the target,
// in a file of the given size. It bisects over the beacons with markers for
// the key (O(log n) beacon reads, spec §12), then reads forward from the last
// beacon known to be before the target, checked against the frames from
// the beacon before it (CheckedBoundary); past a damaged one, from the first
// beacon before it that is not (the header at worst). Beacons without a
// marker for the key are stepped over. It assumes that sequences and
// timestamps of a key grow through the file, as writers produce them.
func Seek(r io.ReaderAt, h Header, size int64, t Target) (int64, error) {
	interval := int64(h.BeaconInterval)
	left, right := int64(0), size/interval+1 // beacon indexes: 0 is the header, known before the target
	probe := func(k int64) (known, isRight bool, err error) {
		b, err := ReadBeaconAt(r, h, k*interval)
		if err != nil {
			if errors.Is(err, ErrTruncated) {
				return true, true, nil // a beacon still being written is past everything
			}
			return false, false, err
		}
		for _, m := range b.Markers {
			if m.Key == t.Key {
				return true, t.right(m.Seq, m.TimestampMs), nil
			}
		}
		return false, false, nil
	}
	for right-left > 1 {
		mid := left + (right-left)/2
		// Look for a deciding beacon near mid, alternating outwards.
		decided := false
		for step := int64(0); !decided; step++ {
			candidates := []int64{mid + step, mid - step - 1}
			if mid+step >= right && mid-step-1 <= left {
				break
			}
			for _, k := range candidates {
				if k <= left || k >= right {
					continue
				}
				known, isRight, err := probe(k)
				if err != nil {
					return 0, err
				}
				if known {
					if isRight {
						right = k
					} else {
						left = k
					}
					decided = true
					break
				}
			}
		}
		if !decided {
			break
		}
	}
	start := int64(HeaderSize)
	for ; left > 0; left-- {
		p, err := CheckedBoundary(r, h, left*interval)
		var fe *FormatError
		if errors.As(err, &fe) || errors.Is(err, ErrTruncated) {
			continue // a damaged beacon, damage before it, or a frame through a beacon still being written: start further back
		}
		if err != nil {
			return 0, fmt.Errorf("streamfile: seek: beacon at %d: %w", left*interval, err)
		}
		start = p
		break
	}
	d := NewDecoder(r, h, start)
	d.ReadSize = int(min(interval, defaultReadSize))
	for {
		rec, err := d.Next()
		var ce *ChecksumError
		var fe *FormatError
		switch {
		case err == nil:
			if rec.Key == t.Key && t.right(rec.Seq, rec.TimestampMs) {
				return rec.Offset, nil
			}
		case errors.As(err, &ce):
			// The frame's fields were read; only its payload is damaged.
		case errors.Is(err, io.EOF), errors.Is(err, ErrTruncated), errors.Is(err, ErrEndOfStream):
			return 0, ErrNotFound
		case errors.As(err, &fe):
			// Bytes that are not a frame: read on where a follower
			// skipping them does.
			if ok, err := d.SkipDamage(fe, size); err != nil || !ok {
				return 0, cmp.Or(err, ErrNotFound)
			}
		default:
			return 0, err
		}
	}
}

// CheckedBoundary returns the frame boundary that the beacon at boundary b
// leads to, checked when it can be: the frames read from the boundary of
// the beacon before it (or from the header) must show that the first frame
// after b starts there. Beacons carry no checksum: a damaged count of what
// remains of the frame a beacon interrupts would lead a seek into the
// middle of a frame, or past frames it should find. A [*FormatError] says
// that beacon b cannot be read or disagrees with those frames; when they
// cannot be read themselves (damaged frames, a damaged beacon before b),
// nothing can be checked, and the boundary is b's alone. It reads up to one
// interval, and any frame that spans b whole.
func CheckedBoundary(r io.ReaderAt, h Header, b int64) (int64, error) {
	interval := int64(h.BeaconInterval)
	d := NewDecoder(r, h, HeaderSize)
	d.ReadSize = maxBeaconSize(h.BeaconInterval)
	p, err := d.resync(b)
	if err != nil {
		return 0, err
	}
	from := int64(HeaderSize)
	if b > interval {
		if from, err = d.resync(b - interval); err != nil {
			if fe, ok := errors.AsType[*FormatError](err); ok && fe.Offset >= b {
				return 0, err // through a frame that spans b, the beacon before disagrees with b
			}
			return p, nil
		}
	}
	d = NewDecoder(r, h, from)
	d.ReadSize = int(min(interval, defaultReadSize))
	mismatch := func(at int64) error {
		return &FormatError{Offset: b, Reason: fmt.Sprintf("beacon leads to offset %d, but the frames read from offset %d go on at %d (a damaged beacon)", p, from, at)}
	}
	good := true // no frame read yet, or the last had a matching checksum: d.Pos() is a frame start
	for at, end := from, from; at <= b; {
		rec, err := d.Next()
		var ce *ChecksumError
		var fe *FormatError
		switch {
		case err == nil:
			at, end, good = rec.Offset, rec.End, true
		case errors.As(err, &ce): // a damaged payload leaves the framing intact
			at, end, good = ce.Offset, ce.End, false
		case errors.Is(err, io.EOF), errors.Is(err, ErrEndOfStream):
			if end > b && p < end {
				return 0, mismatch(end) // p lies in the last frame, which spans b
			}
			return p, nil // no frame after b yet: nothing to check p against
		case errors.Is(err, ErrTruncated), errors.As(err, &fe):
			// The frames before the one that cannot be read were read: when
			// they reach past b, that one starts where b must lead.
			if pos := d.Pos(); good && pos > b && pos%interval != 0 && pos != p {
				return 0, mismatch(pos)
			}
			return p, nil
		default:
			return 0, err
		}
		if at > b && at != p {
			return 0, mismatch(at)
		}
	}
	return p, nil
}

// ReadBeaconAt reads the beacon at boundary at with a single read of at most
// one beacon's size.
func ReadBeaconAt(r io.ReaderAt, h Header, at int64) (Beacon, error) {
	if at <= 0 || at%int64(h.BeaconInterval) != 0 {
		return Beacon{}, fmt.Errorf("streamfile: offset %d is not a beacon boundary (interval %d)", at, h.BeaconInterval)
	}
	d := NewDecoder(r, h, at)
	d.ReadSize = maxBeaconSize(h.BeaconInterval)
	if _, err := d.readBeacon(at); err != nil {
		return Beacon{}, err
	}
	b := d.beacon
	b.Markers = append([]Marker(nil), b.Markers...)
	return b, nil
}

func maxBeaconSize(interval uint32) int {
	return int(min(int64(interval), beaconOverhead+255*maxMarkerSize))
}

// FrameBoundaryAfter returns the first frame boundary at or after off: off
// itself when it is the end of the header, otherwise the frame start reached
// through the next beacon (spec §6.5).
func FrameBoundaryAfter(r io.ReaderAt, h Header, off int64) (int64, error) {
	if off <= HeaderSize {
		return HeaderSize, nil
	}
	interval := int64(h.BeaconInterval)
	b := (off + interval - 1) / interval * interval
	d := NewDecoder(r, h, b)
	d.ReadSize = maxBeaconSize(h.BeaconInterval)
	return d.resync(b)
}

// SkipDamage returns where a reader goes on after the bytes at off that
// are not a frame, in a file of the given size: at the first whole frame
// after them before the next beacon ([WholeFrameAfter]), else at the frame
// boundary that the first beacon after them that is not damaged gives; -1
// when the file does not hold it yet.
func SkipDamage(r io.ReaderAt, h Header, off, size int64) (int64, error) {
	interval := int64(h.BeaconInterval)
	next := (off/interval + 1) * interval
	if q, err := WholeFrameAfter(r, interval, off, min(size, next)); err != nil || q >= 0 {
		return q, err
	}
	for ; next < size; next += interval {
		p, err := FrameBoundaryAfter(r, h, next)
		var fe *FormatError
		switch {
		case err == nil && p <= size:
			return p, nil
		case err == nil, errors.Is(err, ErrTruncated):
			return -1, nil // the rest of the frame after the beacon, or the beacon, is still being written
		case !errors.As(err, &fe):
			return -1, err
		}
		// The beacon is damaged too: the one after it.
	}
	return -1, nil
}

// End returns the offset after the last complete frame of a file of the
// given size: where a reader that starts at the end begins (spec §11.3). It
// reads from the last beacon whose interrupted frame is complete and that
// the frames before it confirm (CheckedBoundary). What a
// crash left after the last frame ([CrashLeftovers]) is not passed over:
// the next writer appends where it begins.
func End(r io.ReaderAt, h Header, size int64) (int64, error) {
	interval := int64(h.BeaconInterval)
	start := int64(HeaderSize)
	for b := size - size%interval; b >= interval; b -= interval {
		p, err := CheckedBoundary(r, h, b)
		if err == nil && p <= size {
			start = p
			break
		}
		var fe *FormatError
		if err != nil && !errors.Is(err, ErrTruncated) && !errors.As(err, &fe) { // a damaged beacon: the one before
			return 0, err
		}
	}
	end, left, err := endFrom(r, h, start, size)
	if err == nil && left && end == start && start > HeaderSize {
		// Zeros that reach a boundary pass for an empty beacon there: the
		// records may end before it. Read from the beginning, as a writer
		// does (Writer.scanLast).
		end, _, err = endFrom(r, h, HeaderSize, size)
	}
	return end, err
}

// endFrom reads the file from the frame at start and returns where its
// complete frames end, past damage a reader skips, and whether what
// follows is a crash's leftovers.
func endFrom(r io.ReaderAt, h Header, start, size int64) (end int64, leftovers bool, err error) {
	interval := int64(h.BeaconInterval)
	d := NewDecoder(r, h, start)
	d.ReadSize = int(min(interval, defaultReadSize))
	crashed := func(off int64) bool {
		ok, err := CrashLeftovers(r, interval, off, size)
		return err == nil && ok
	}
	for {
		_, err := d.Next()
		var ce *ChecksumError
		var fe *FormatError
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, ErrTruncated), errors.Is(err, ErrEndOfStream):
			return d.Pos(), false, nil
		case errors.As(err, &ce):
			if crashed(ce.Offset) {
				return ce.Offset, true, nil
			}
		case errors.As(err, &fe) && crashed(fe.Offset):
			return fe.Offset, true, nil
		case errors.As(err, &fe):
			// Bytes that are not a frame: a reader goes on after them
			// (SkipDamage); while nothing follows them, it waits before
			// them, as at a torn frame.
			if ok, err := d.SkipDamage(fe, size); err != nil || !ok {
				return d.Pos(), false, err
			}
		default:
			return 0, false, err
		}
	}
}
