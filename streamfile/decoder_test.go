package streamfile

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// TestSkipToNextBeaconPastTheEnd: a skip that finds no beacon (the file
// ends before the next boundary) leaves the decoder at the bad frame, which
// the next call reports again, through reads and in place alike.
func TestSkipToNextBeaconPastTheEnd(t *testing.T) {
	file, err := AppendHeader(nil, &Header{FileName: "bad.ss", BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	file = append(append(file, 0xFF), bytes.Repeat([]byte{1}, 300)...) // a key of 255 bytes: no frame
	for _, inPlace := range []bool{false, true} {
		t.Run(fmt.Sprintf("inplace=%v", inPlace), func(t *testing.T) {
			h, _ := ReadHeader(bytes.NewReader(file))
			d := NewDecoder(bytes.NewReader(file), h, HeaderSize)
			if inPlace {
				d = NewBytesDecoder(file, h, HeaderSize)
			}
			var fe *FormatError
			if _, err := d.Next(); !errors.As(err, &fe) {
				t.Fatalf("Next = %v, want a format error", err)
			}
			if err := d.SkipToNextBeacon(); !errors.Is(err, ErrTruncated) {
				t.Fatalf("SkipToNextBeacon = %v, want ErrTruncated", err)
			}
			if _, err := d.Next(); !errors.As(err, &fe) || fe.Offset != HeaderSize {
				t.Fatalf("Next after the failed skip = %v, want the format error at %d again", err, HeaderSize)
			}
		})
	}
}
