package streamfile

import "testing"

func TestCRC16(t *testing.T) {
	tests := []struct {
		in   string
		want uint16
	}{
		{"123456789", 0x4C06},
		{"hello, world", 0x8028},
		{"", 0xFFFF},
		{"EOS", 0xED7C},
		{"123456789abcd", 0xA106},
	}
	for _, tt := range tests {
		if got := CRC16([]byte(tt.in)); got != tt.want {
			t.Errorf("CRC16(%q) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
}

func TestCRCTable(t *testing.T) {
	for i, want := range map[int]uint16{1: 0xC867, 2: 0x58A9, 128: 0x5E5A, 255: 0x946C} {
		if got := crcTables[0][i]; got != want {
			t.Errorf("table[%d] = %#04x, want %#04x", i, got, want)
		}
	}
}

// TestCRCSlicingMatchesBitwise compares the sliced update with the bitwise
// definition of spec §5 for every length up to 64 and random starting
// registers.
func TestCRCSlicingMatchesBitwise(t *testing.T) {
	bitwise := func(crc uint16, p []byte) uint16 {
		for _, b := range p {
			crc ^= uint16(b) << 8
			for range 8 {
				if crc&0x8000 != 0 {
					crc = crc<<1 ^ crcPoly
				} else {
					crc <<= 1
				}
			}
		}
		return crc
	}
	buf := make([]byte, 64)
	for i := range buf {
		buf[i] = byte(i*131 + 7)
	}
	for n := 0; n <= len(buf); n++ {
		for _, start := range []uint16{0, 0xFFFF, 0x1234} {
			if got, want := UpdateCRC16(start, buf[:n]), bitwise(start, buf[:n]); got != want {
				t.Fatalf("len %d start %#04x: got %#04x, want %#04x", n, start, got, want)
			}
		}
	}
}
