package streamfile

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// KeyRecords is how many records of one stream key a repair would discard,
// and their sequence numbers.
type KeyRecords struct {
	Key               string
	Count             int
	FirstSeq, LastSeq uint64
}

// LossError is [Repair]'s refusal to discard records that readers still
// read after the damage: a reader that skips damaged bytes (streamd's
// on_corrupt = "skip", the default) reads on after it, where a truncation
// would cut too.
type LossError struct {
	Damage  *DamageError
	Records []KeyRecords // by key
}

// Count is the number of records the truncation would discard.
func (e *LossError) Count() int {
	n := 0
	for _, k := range e.Records {
		n += k.Count
	}
	return n
}

func (e *LossError) Error() string {
	var keys []string
	for _, k := range e.Records {
		keys = append(keys, fmt.Sprintf("key %s: %d of seq %d to %d", k.Key, k.Count, k.FirstSeq, k.LastSeq))
	}
	return fmt.Sprintf("streamfile: %s: truncating at offset %d would discard %d record(s) that readers skipping the damage still read (%s)",
		e.Damage.File, e.Damage.Offset, e.Count(), strings.Join(keys, "; "))
}

// OversizeError is [Repair]'s refusal to cut off a frame whose payload size
// is over the decoder's limit: a record another writer may have written
// whole (the format allows up to 4 GiB), or a damaged size field.
type OversizeError struct {
	Damage      *DamageError
	Offset      int64 // of the frame, at or after the damage
	PayloadSize int64
}

func (e *OversizeError) Error() string {
	return fmt.Sprintf("streamfile: %s: the frame at offset %d holds a payload of %d bytes, more than streamd reads (%d): a record another writer wrote, or a damaged size field",
		e.Damage.File, e.Offset, e.PayloadSize, DefaultMaxPayload)
}

// Repair makes the stream file at path appendable when writers refuse it
// with a [*DamageError]: it reads the whole file under the file's lock, and
// when its readable records stop before its end it calls discard with the
// damage, then truncates the file at the damage's offset, discarding what
// follows (an end-of-stream frame in the middle and every frame after it, or
// the bytes after the last good frame), and syncs it. Unless force is set,
// it refuses, changing nothing, a cut at a frame larger than the decoder
// reads ([*OversizeError]) and one that would discard records readers
// that skip the damage read after it ([*LossError]). It returns the damage it repaired, nil
// when there was none, and where the next append writes: the damage's
// offset, or, without damage, the file's size or the start of what the
// next append removes or overwrites itself (a torn last frame, zeros to the
// end after it, a closing end-of-stream frame).
func Repair(path string, force bool, discard func(*DamageError)) (*DamageError, int64, error) {
	w, err := OpenWriter(path, CreateOptions{})
	if err != nil {
		return nil, 0, err
	}
	var de *DamageError
	var next int64
	err = w.locked(func() error {
		size, err := w.size()
		if err != nil {
			return err
		}
		se, err := w.scan(HeaderSize, size, nil)
		next = se.next
		if !errors.As(err, &de) {
			return err
		}
		if !force {
			lost, oversize, err := readAfter(w.f, w.hdr, de.Offset, size)
			switch {
			case err != nil:
				return err
			case oversize != nil:
				return &OversizeError{Damage: de, Offset: oversize.Offset, PayloadSize: oversize.PayloadSize}
			case len(lost) > 0:
				return &LossError{Damage: de, Records: lost}
			}
		}
		discard(de)
		next = de.Offset
		if err := w.f.Truncate(de.Offset); err != nil {
			return fmt.Errorf("streamfile: truncate %s at %d: %w", path, de.Offset, err)
		}
		return w.Sync()
	})
	return de, next, errors.Join(err, w.Close())
}

// readAfter returns, by key, the records that a reader skipping damage
// reads in the file of the given size from the damaged bytes at off on:
// after a frame whose checksum does not match, at the first whole frame
// before the next beacon after bytes that are not a frame, or else at the
// frame boundary a beacon after them gives, and at a whole frame after one
// that runs past the end, also when its size is over the decoder's limit.
// An end-of-stream frame ends them: readers stop there. It stops at the
// first frame larger than the decoder reads that is not followed so, and
// returns its error.
func readAfter(r io.ReaderAt, h Header, off, size int64) ([]KeyRecords, *FormatError, error) {
	byKey := map[string]*KeyRecords{}
	d := NewDecoder(r, h, off)
	for {
		rec, err := d.Next()
		var ce *ChecksumError
		var fe *FormatError
		switch {
		case err == nil && rec.IsEOS():
			return sortedKeys(byKey), nil, nil
		case err == nil && rec.End <= size:
			k := byKey[rec.Key]
			if k == nil {
				k = &KeyRecords{Key: rec.Key, FirstSeq: rec.Seq}
				byKey[rec.Key] = k
			}
			k.Count++
			k.LastSeq = rec.Seq
		case errors.As(err, &ce):
		case errors.As(err, &fe) && fe.PayloadSize > 0:
			// Whole frames after one that the file cannot hold show a
			// damaged size field; without them, it may be a record being
			// written, or one another writer wrote whole.
			p := int64(-1)
			if fe.Offset+fe.PayloadSize > size {
				if p, err = WholeFrameAfter(r, int64(h.BeaconInterval), fe.Offset, size); err != nil {
					return nil, nil, err
				}
			}
			if p < 0 {
				return sortedKeys(byKey), fe, nil
			}
			d = NewDecoder(r, h, p)
		case errors.As(err, &fe):
			if ok, err := d.SkipDamage(fe, size); err != nil || !ok {
				return sortedKeys(byKey), nil, err
			}
		case errors.Is(err, ErrTruncated):
			// A frame that runs past the end: a torn tail, or a damaged
			// size when a whole frame follows.
			p, err := WholeFrameAfter(r, int64(h.BeaconInterval), d.Pos(), size)
			if err != nil || p < 0 {
				return sortedKeys(byKey), nil, err
			}
			d = NewDecoder(r, h, p)
		case err == nil, errors.Is(err, io.EOF), errors.Is(err, ErrEndOfStream):
			return sortedKeys(byKey), nil, nil
		default:
			return nil, nil, err
		}
	}
}

// sortedKeys returns the records of byKey in key order.
func sortedKeys(byKey map[string]*KeyRecords) []KeyRecords {
	var out []KeyRecords
	for _, k := range byKey {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b KeyRecords) int { return strings.Compare(a.Key, b.Key) })
	return out
}
