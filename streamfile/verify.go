package streamfile

import (
	"errors"
	"fmt"
	"io"
	"slices"
)

// VerifyReport summarises a file checked by [Verify].
type VerifyReport struct {
	Frames  int   // complete frames, the end-of-stream frame included
	Beacons int   // boundaries checked
	End     int64 // offset after the last complete frame
}

// Verify reads a whole file of the given size and checks that every frame
// decodes with a valid checksum and that the beacon at every boundary leads,
// through its remaining count, to a frame start the sequential reader found
// too (spec §6.5). A torn last frame is allowed; it ends the check.
func Verify(r io.ReaderAt, size int64) (VerifyReport, error) {
	r = io.NewSectionReader(r, 0, size) // a file still growing is read up to size
	var rep VerifyReport
	h, err := ReadHeader(r)
	if err != nil {
		return rep, err
	}
	var starts []int64
	d := NewDecoder(r, h, HeaderSize)
	for {
		rec, err := d.Next()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, ErrTruncated) || errors.Is(err, ErrEndOfStream) {
				break
			}
			return rep, err
		}
		starts = append(starts, rec.Offset)
		rep.Frames++
	}
	rep.End = d.Pos()
	interval := int64(h.BeaconInterval)
	for b := interval; b < rep.End; b += interval {
		p, err := FrameBoundaryAfter(r, h, b)
		if err != nil {
			return rep, fmt.Errorf("streamfile: beacon at %d: %w", b, err)
		}
		if _, found := slices.BinarySearch(starts, p); !found && p != rep.End {
			return rep, fmt.Errorf("streamfile: beacon at %d leads to offset %d, which is not a frame start", b, p)
		}
		rep.Beacons++
	}
	return rep, nil
}
