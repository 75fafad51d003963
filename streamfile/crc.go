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

// crcTables holds the slicing-by-16 tables: crcTables[k][b] is the register
// after feeding byte b followed by k zero bytes into a register of 0.
var crcTables = makeCRCTables()

func makeCRCTables() *[16][256]uint16 {
	t := new([16][256]uint16)
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
	for k := 1; k < 16; k++ {
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
	for len(p) >= 16 {
		// The lookups that do not depend on the register are combined
		// first, so that only two lookups and two XORs lie on the chain
		// from one register value to the next.
		q := p[:16]
		x := ((t[13][q[2]] ^ t[12][q[3]]) ^ (t[11][q[4]] ^ t[10][q[5]])) ^
			((t[9][q[6]] ^ t[8][q[7]]) ^ (t[7][q[8]] ^ t[6][q[9]])) ^
			((t[5][q[10]] ^ t[4][q[11]]) ^ (t[3][q[12]] ^ t[2][q[13]])) ^
			(t[1][q[14]] ^ t[0][q[15]])
		crc = t[15][q[0]^byte(crc>>8)] ^ t[14][q[1]^byte(crc)] ^ x
		p = p[16:]
	}
	for _, b := range p {
		crc = t[0][byte(crc>>8)^b] ^ crc<<8
	}
	return crc
}
