package streamfile

// CRC-16/CDMA2000: width 16, polynomial 0xC867, initial value 0xFFFF, no
// reflection, no final XOR (spec §5). Because there is no final XOR, the
// register after N bytes is the checksum, and an update can resume from any
// intermediate value, which the running checksum of beacon markers relies on.

const (
	crcPoly = 0xC867
	// CRCInit is the initial register value, and the checksum of an empty payload.
	CRCInit uint16 = 0xFFFF
)

// crcTables holds the slicing-by-8 tables: crcTables[k][b] is the register
// after feeding byte b followed by k zero bytes into a register of 0.
var crcTables = makeCRCTables()

func makeCRCTables() *[8][256]uint16 {
	t := new([8][256]uint16)
	for i := range 256 {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ crcPoly
			} else {
				crc <<= 1
			}
		}
		t[0][i] = crc
	}
	for k := 1; k < 8; k++ {
		for i := range 256 {
			prev := t[k-1][i]
			t[k][i] = prev<<8 ^ t[0][prev>>8]
		}
	}
	return t
}

// CRC16 returns the CRC-16/CDMA2000 checksum of p.
func CRC16(p []byte) uint16 { return UpdateCRC16(CRCInit, p) }

// UpdateCRC16 feeds p into the register crc and returns the new register.
func UpdateCRC16(crc uint16, p []byte) uint16 {
	t := crcTables
	for len(p) >= 8 {
		crc = t[7][p[0]^byte(crc>>8)] ^ t[6][p[1]^byte(crc)] ^
			t[5][p[2]] ^ t[4][p[3]] ^ t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]]
		p = p[8:]
	}
	for _, b := range p {
		crc = t[0][byte(crc>>8)^b] ^ crc<<8
	}
	return crc
}
