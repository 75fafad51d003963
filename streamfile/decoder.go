package streamfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// ErrEndOfStream is returned by [Decoder.Next] after the end-of-stream frame
// was returned: nothing after it is read.
var ErrEndOfStream = errors.New("streamfile: end of stream")

const (
	defaultReadSize = 256 << 10
	// DefaultMaxPayload bounds the payload size the decoder accepts, so that a
	// corrupt size field cannot make it buffer gigabytes.
	DefaultMaxPayload = 64 << 20
	maxInternedKeys   = 4096
)

// Record is a frame as read from a file, with where it was found.
type Record struct {
	Frame
	Offset   int64  // first byte of the frame (after a beacon that precedes it)
	End      int64  // offset of the next frame or beacon
	Checksum uint16 // stored payload checksum, verified
}

// Decoder reads frames sequentially from a stream file, starting at the end
// of the header or at any frame boundary. It reads through an [io.ReaderAt],
// so a file that grows is read further by calling Next again: a frame (or
// beacon) that is not complete yet yields [ErrTruncated] and the position
// stays at its start, so a later call continues exactly.
//
// A Decoder is not safe for concurrent use. Payloads alias its buffer and are
// valid until the next call to Next. It keeps the memory it reads frames
// into from one call to the next up to four reads' worth (1 MiB by
// default, a frame of the default beacon interval): a larger frame costs
// about its size once, which the next call lets go of.
type Decoder struct {
	r        io.ReaderAt
	interval int64
	pos      int64 // next frame, or the beacon at a boundary before it

	buf    []byte // file bytes [bufOff, bufOff+len(buf))
	bufOff int64

	small   [MaxKeyLen + 40]byte // frame fields that straddle a beacon
	scratch []byte               // payloads that straddle a beacon
	rec     Record
	beacon  Beacon
	keys    map[string]string
	lastKey string

	onBeacon     func(at int64, b *Beacon)
	lastReported int64
	eos          bool

	// shortAt is where the last read that found the end of the file
	// ended, read during the nexts-th call of Next as shortIn says: bytes
	// read so are the start of a frame a writer may since have truncated
	// (a torn tail) and written anew.
	shortAt        int64
	nexts, shortIn int
	inNext         bool // Next is reading a frame, which it can read again whole

	// MaxPayload is the largest payload accepted; larger sizes are a format
	// error. Zero means [DefaultMaxPayload].
	MaxPayload int
	// ReadSize is how many bytes each read asks for. Zero means 256 KiB.
	ReadSize int
}

// NewDecoder returns a decoder over r, a file whose header is h, that reads
// from offset: [HeaderSize] for the first frame, or any frame boundary such
// as a [Record.End] or a beacon offset.
func NewDecoder(r io.ReaderAt, h Header, offset int64) *Decoder {
	return &Decoder{
		r:            r,
		interval:     int64(h.BeaconInterval),
		pos:          max(offset, HeaderSize),
		bufOff:       max(offset, HeaderSize),
		keys:         make(map[string]string),
		lastReported: -1,
		shortAt:      -1,
	}
}

// errStale is ensure's error when the frame being read began in bytes read
// at the end of the file during an earlier call of Next and goes on past
// them: Next reads it again whole.
var errStale = errors.New("streamfile: frame read in part at an earlier end of the file")

// ReadHeader reads and parses the header of r.
func ReadHeader(r io.ReaderAt) (Header, error) {
	var b [HeaderSize]byte
	n, err := r.ReadAt(b[:], 0)
	if n < HeaderSize && err != nil && !errors.Is(err, io.EOF) {
		return Header{}, err
	}
	return ParseHeader(b[:n])
}

// OnBeacon sets a function called with every complete beacon the decoder
// passes, once per beacon even when a frame around it is retried. b is valid
// only during the call.
func (d *Decoder) OnBeacon(fn func(at int64, b *Beacon)) { d.onBeacon = fn }

// Pos returns the offset where the next call to Next starts reading.
func (d *Decoder) Pos() int64 { return d.pos }

// Next returns the next frame. It returns:
//   - io.EOF when no byte follows the position yet (a clean end);
//   - [ErrTruncated] when the data ends inside a frame or beacon;
//   - a [*ChecksumError] for a frame whose payload does not match its
//     checksum; the position moves past it, so Next may be called again;
//   - a [*FormatError] for bytes that are not a frame; the position stays
//     (see [Decoder.SkipDamage]);
//   - [ErrEndOfStream] once the end-of-stream frame was returned.
func (d *Decoder) Next() (*Record, error) {
	d.release()
	d.nexts++
	d.inNext = true
	for {
		rec, err := d.next()
		if err != errStale {
			d.inNext = false
			return rec, err
		}
		// The frame's start was read when the file ended within it: the
		// end of a torn tail, perhaps, which a writer has since truncated
		// and written anew; the rest read now would be the new frame's.
		d.buf, d.bufOff, d.shortAt = d.buf[:0], d.pos, -1
	}
}

// next is one try of Next.
func (d *Decoder) next() (*Record, error) {
	if d.eos {
		return nil, ErrEndOfStream
	}
	d.compact()
	if d.atBoundary(d.pos) {
		n, err := d.readBeacon(d.pos)
		if err != nil {
			return nil, d.startErr(err)
		}
		d.pos += int64(n)
	}
	rec, err := d.readFrame()
	if err != nil {
		return nil, d.startErr(err)
	}
	if rec.IsEOS() {
		d.eos = true
	}
	return rec, nil
}

// startErr turns a shortage at the very start of a read into io.EOF. After
// a shortage inside a frame it forgets the bytes read: a torn tail may be
// truncated and written anew by a writer that repairs it (spec §10), and
// the next call must read what is there then, not combine old and new.
//
// The buffer starts at the position again after any error: a payload read
// past the buffer (take) leaves it starting inside the frame, whose first
// bytes were read, so that a shortage there is never a clean end.
func (d *Decoder) startErr(err error) error {
	if err == ErrTruncated && d.bufOff <= d.pos && !d.have(d.pos, 1) {
		return io.EOF
	}
	if err == ErrTruncated || d.bufOff > d.pos {
		d.buf, d.bufOff = d.buf[:0], d.pos
	}
	return err
}

func (d *Decoder) atBoundary(off int64) bool { return off > 0 && off%d.interval == 0 }

func (d *Decoder) maxPayload() int {
	if d.MaxPayload > 0 {
		return d.MaxPayload
	}
	return DefaultMaxPayload
}

// readFrame parses the frame at d.pos. A fast path handles the common case of
// a frame that lies between two boundaries: it is parsed in place from the
// buffer.
func (d *Decoder) readFrame() (*Record, error) {
	start := d.pos
	room := d.interval - start%d.interval // bytes before the next boundary
	if err := d.fill(start, start+1); err != nil {
		return nil, err
	}
	l := int64(d.buf[start-d.bufOff])
	if hdr := l + 29; hdr <= room {
		if err := d.fill(start, start+hdr); err != nil {
			if !errors.Is(err, ErrTruncated) {
				return nil, err
			}
			// Too short for the fields: the slow path tells a torn
			// frame from one whose key is already wrong.
			return d.readFrameSlow(start)
		}
		n := int64(binary.BigEndian.Uint32(d.buf[start-d.bufOff+l+25:]))
		if total := l + n + frameOverhead; total <= room && n <= int64(d.maxPayload()) {
			if err := d.fill(start, start+total); err != nil {
				return nil, err
			}
			b := d.buf[start-d.bufOff:]
			key, ok := d.intern(b[1 : 1+l])
			if !ok {
				return nil, &FormatError{Offset: start, Reason: fmt.Sprintf("invalid stream key %s", quoteKey(key))}
			}
			return d.finishFields(start, key, b[1+l:hdr], b[hdr:hdr+n], b[hdr+n:total], start+total)
		}
	}
	return d.readFrameSlow(start)
}

// readFrameSlow parses a frame field by field, stepping over beacons.
func (d *Decoder) readFrameSlow(start int64) (*Record, error) {
	if start > d.bufOff {
		// Nothing of this frame was handed out yet: make room in place.
		n := copy(d.buf, d.buf[start-d.bufOff:])
		d.buf = d.buf[:n]
		d.bufOff = start
	}
	c := start
	lb, _, err := d.take(&c, 1, d.small[:0], false)
	if err != nil {
		return nil, err
	}
	// The key first: a frame whose key is wrong is damage even when the
	// file ends before its other fields, not a frame still being written.
	kb, _, err := d.take(&c, int(lb[0]), d.small[:0], false)
	if err != nil {
		return nil, err
	}
	key, ok := d.intern(kb)
	if !ok {
		return nil, &FormatError{Offset: start, Reason: fmt.Sprintf("invalid stream key %s", quoteKey(key))}
	}
	head, _, err := d.take(&c, 28, d.small[:0], false) // shard, seq, ts, size
	if err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[24:]))
	if n > d.maxPayload() {
		return nil, &FormatError{Offset: start, Reason: fmt.Sprintf("payload size %d exceeds the decoder limit of %d bytes", n, d.maxPayload()), PayloadSize: int64(n)}
	}
	fields := [24]byte(head)
	// Nothing taken from the buffer before the payload is used any more:
	// the payload's bytes may be read past it.
	payload, copied, err := d.take(&c, n, d.scratch[:0], true)
	if err != nil {
		return nil, err
	}
	if copied {
		d.scratch = payload[:0]
	}
	tail, _, err := d.take(&c, 3, d.small[:0], false)
	if err != nil {
		return nil, err
	}
	return d.finishFields(start, key, fields[:], payload, tail, c)
}

func (d *Decoder) finishFields(start int64, key string, fields, payload, tail []byte, end int64) (*Record, error) {
	r := &d.rec
	r.Key = key
	r.Shard = binary.BigEndian.Uint64(fields[0:])
	r.Seq = binary.BigEndian.Uint64(fields[8:])
	r.TimestampMs = binary.BigEndian.Uint64(fields[16:])
	r.Payload = payload[:len(payload):len(payload)] // an append copies, never writes over what follows
	r.Offset, r.End = start, end
	r.Checksum = binary.BigEndian.Uint16(tail)
	if r.TimestampMs > maxTimestampMs {
		return nil, &FormatError{Offset: start, Reason: fmt.Sprintf("timestamp %d ms is after year 9999", r.TimestampMs)}
	}
	if sum := CRC16(payload); sum != r.Checksum {
		d.pos = end
		return nil, &ChecksumError{Offset: start, End: end, Key: key, Seq: r.Seq, Received: r.Checksum, Computed: sum}
	}
	d.pos = end
	return r, nil
}

// take returns the next n logical bytes at *c, stepping over beacons, and
// advances *c. Bytes that lie between two boundaries are returned from the
// buffer; bytes that straddle a beacon are copied into dst (copied is true),
// which grows at once to hold them when it is too small.
//
// With past, which a caller passes only when it no longer uses anything it
// took from the buffer during this frame, the copied bytes do not pass
// through the buffer, which then only ever holds a read's worth of them:
// what it does not hold yet of the part between two beacons is read
// straight into dst when that is a read's worth or more, and through the
// buffer, used again from its start, when less. A frame of many intervals
// is then neither read into memory twice nor held twice, and its reads
// are as large as the parts between its beacons.
func (d *Decoder) take(c *int64, n int, dst []byte, past bool) (b []byte, copied bool, err error) {
	if d.atBoundary(*c) {
		bn, err := d.readBeacon(*c)
		if err != nil {
			return nil, false, err
		}
		*c += int64(bn)
	}
	if room := d.interval - *c%d.interval; int64(n) <= room {
		if err := d.ensure(*c + int64(n)); err != nil {
			return nil, false, err
		}
		i := *c - d.bufOff
		*c += int64(n)
		return d.buf[i : i+int64(n)], false, nil
	}
	if cap(dst)-len(dst) < n {
		dst = d.room(dst, n, *c)
	}
	for n > 0 {
		if past && *c == d.bufOff+int64(len(d.buf)) {
			// The buffer holds nothing from *c on, and nothing before
			// it is used: it starts at *c again.
			d.buf, d.bufOff = d.buf[:0], *c
		}
		if d.atBoundary(*c) {
			bn, err := d.readBeacon(*c)
			if err != nil {
				return nil, false, err
			}
			*c += int64(bn)
		}
		chunk := min(int64(n), d.interval-*c%d.interval)
		if past {
			i := *c - d.bufOff
			held := min(chunk, int64(len(d.buf))-i)
			dst = append(dst, d.buf[i:i+held]...)
			*c += held
			n -= int(held)
			chunk -= held
			if chunk == 0 {
				continue
			}
			d.buf, d.bufOff = d.buf[:0], *c
			if chunk >= int64(d.readSize()) {
				if cap(dst)-len(dst) < int(chunk) {
					dst = d.room(dst, n, *c) // the file may have grown
				}
				// Without room, the file ends before: the read
				// through the buffer says how.
				if free := int64(cap(dst) - len(dst)); free > 0 {
					m, err := d.readInto(&dst, *c, min(chunk, free))
					*c += m
					n -= int(m)
					d.bufOff = *c
					if err != nil {
						return nil, false, err
					}
					continue
				}
			}
		}
		if err := d.ensure(*c + chunk); err != nil {
			return nil, false, err
		}
		i := *c - d.bufOff
		dst = append(dst, d.buf[i:i+chunk]...)
		*c += chunk
		n -= int(chunk)
	}
	return dst, true, nil
}

// readBeacon parses the beacon at the boundary at and returns its size.
func (d *Decoder) readBeacon(at int64) (int, error) {
	if err := d.ensure(at + 6); err != nil {
		return 0, err
	}
	b := d.buf[at-d.bufOff:]
	bc := &d.beacon
	bc.Remaining = binary.BigEndian.Uint32(b[1:])
	count := int(b[5])
	bc.Markers = bc.Markers[:0]
	size := int64(6)
	for range count {
		if err := d.ensure(at + size + 1); err != nil {
			return 0, err
		}
		l := int64(d.buf[at-d.bufOff+size])
		msize := l + markerOverhead
		if size+msize+1 >= d.interval {
			return 0, &FormatError{Offset: at, Reason: fmt.Sprintf("beacon with %d markers does not fit below the next boundary (interval %d)", count, d.interval)}
		}
		if err := d.ensure(at + size + msize); err != nil {
			return 0, err
		}
		m := d.buf[at-d.bufOff+size:]
		key, ok := d.intern(m[1 : 1+l])
		if !ok {
			return 0, &FormatError{Offset: at + size, Reason: fmt.Sprintf("invalid stream key %s in beacon marker", quoteKey(key))}
		}
		f := m[1+l:]
		bc.Markers = append(bc.Markers, Marker{
			Key:             key,
			Shard:           binary.BigEndian.Uint64(f[0:]),
			Seq:             binary.BigEndian.Uint64(f[8:]),
			TimestampMs:     binary.BigEndian.Uint64(f[16:]),
			RunningChecksum: binary.BigEndian.Uint16(f[24:]),
		})
		size += msize
	}
	size++ // end marker; the check in the loop keeps the beacon below the boundary (spec §6.1)
	if err := d.ensure(at + size); err != nil {
		return 0, err
	}
	if at > d.lastReported {
		d.lastReported = at
		if d.onBeacon != nil {
			d.onBeacon(at, bc)
		}
	}
	return int(size), nil
}

// intern returns key as a string without allocating for keys seen before,
// and whether it is a valid stream key (spec §8).
func (d *Decoder) intern(key []byte) (string, bool) {
	if string(key) == d.lastKey {
		return d.lastKey, true
	}
	if s, ok := d.keys[string(key)]; ok {
		d.lastKey = s
		return s, true
	}
	if !validKeyBytes(key) {
		return string(key), false
	}
	s := string(key)
	if len(d.keys) < maxInternedKeys {
		d.keys[s] = s
	}
	d.lastKey = s
	return s, true
}

// have reports whether the buffer holds [off, off+n).
func (d *Decoder) have(off int64, n int64) bool {
	return off >= d.bufOff && off+n <= d.bufOff+int64(len(d.buf))
}

// compact forgets the buffer once everything in it was read. It runs only
// between frames, so that no slice handed out during a frame is overwritten.
func (d *Decoder) compact() {
	if d.pos-d.bufOff >= int64(len(d.buf)) {
		d.buf = d.buf[:0]
		d.bufOff = d.pos
	}
}

// fill makes the buffer hold [start, end), where start is the start of the
// frame being read: bytes before it may be dropped, so the unread rest of
// the buffer moves to the front when the buffer has no room at its end.
func (d *Decoder) fill(start, end int64) error {
	if d.have(start, end-start) {
		return nil
	}
	if d.bufOff+int64(cap(d.buf)) < end && start > d.bufOff {
		if cap(d.buf) < d.readSize() {
			d.grow(end)
		} else {
			n := copy(d.buf, d.buf[start-d.bufOff:])
			d.buf = d.buf[:n]
			d.bufOff = start
		}
	}
	return d.ensure(end)
}

func (d *Decoder) readSize() int {
	if d.ReadSize > 0 {
		return d.ReadSize
	}
	return defaultReadSize
}

// ensure reads until the buffer holds the bytes up to end, or returns
// ErrTruncated when the file ends before.
func (d *Decoder) ensure(end int64) error {
	for d.bufOff+int64(len(d.buf)) < end {
		at := d.bufOff + int64(len(d.buf))
		if err := d.shortHere(at); err != nil {
			return err
		}
		if len(d.buf) == cap(d.buf) {
			d.grow(end)
		}
		n, err := d.readAt(d.buf[len(d.buf):cap(d.buf)], at)
		d.buf = d.buf[:len(d.buf)+n]
		switch {
		case d.bufOff+int64(len(d.buf)) >= end:
		case err != nil:
			return err
		case n == 0:
			return ErrTruncated
		}
	}
	return nil
}

// room returns dst with room for the n bytes of the payload at c that
// take copies into it, allocated at once: appending a large payload a part
// at a time would copy it again at each doubling, and leave the smaller
// arrays behind as garbage. When the reader tells the file's size, the
// room is no larger than the bytes the file holds from c on, so that a
// frame not whole yet, or a damaged size field, costs no more than the
// bytes there; take grows dst further should the file grow meanwhile. Up
// to keepSize, the room doubles at least, as a payload kept for the next
// frames grows.
func (d *Decoder) room(dst []byte, n int, c int64) []byte {
	size := len(dst) + n
	switch {
	case size <= d.keepSize():
		size = min(max(size, 2*cap(dst)), d.keepSize())
	default:
		if end, ok := d.fileSize(); ok {
			size = len(dst) + int(max(min(int64(n), end-c), 0))
		} else {
			// No size to bound it by: grow as bytes come, lest a damaged
			// size field cost MaxPayload at once.
			size = len(dst) + min(n, max(2*cap(dst), d.readSize()))
		}
	}
	if size <= cap(dst) {
		return dst // the file holds no more
	}
	return append(make([]byte, 0, size), dst...)
}

// fileSize returns the size of the file the decoder reads, when its reader
// tells it (a file, a section of one, bytes in memory).
func (d *Decoder) fileSize() (int64, bool) {
	switch r := d.r.(type) {
	case interface{ Size() int64 }:
		return r.Size(), true
	case interface{ Stat() (fs.FileInfo, error) }:
		if fi, err := r.Stat(); err == nil {
			return fi.Size(), true
		}
	}
	return 0, false
}

// readInto reads the n bytes of the file at at onto the end of *dst, which
// has room for them, as ensure reads into the buffer, and returns how many
// it read: fewer with the error that stopped it, ErrTruncated when the file
// ends before.
func (d *Decoder) readInto(dst *[]byte, at, n int64) (int64, error) {
	var done int64
	for done < n {
		if err := d.shortHere(at + done); err != nil {
			return done, err
		}
		b := *dst
		m, err := d.readAt(b[len(b):len(b)+int(n-done)], at+done)
		*dst = b[:len(b)+m]
		done += int64(m)
		switch {
		case done == n:
		case err != nil:
			return done, err
		case m == 0:
			return done, ErrTruncated
		}
	}
	return done, nil
}

// shortHere returns the error of a read at at, where a read of an earlier
// call, or of this one, met the end of the file in the frame being read,
// and nil when no read did.
func (d *Decoder) shortHere(at int64) error {
	if d.inNext && at == d.shortAt && d.pos < at {
		// The frame began in bytes read when the file ended here: a
		// torn frame, maybe, which a writer may since have truncated
		// and written anew; what follows now would be the new one's.
		if d.shortIn != d.nexts {
			return errStale // read in an earlier call: read it again whole
		}
		return ErrTruncated // this call met the end: the next reads it again whole
	}
	return nil
}

// readAt reads len(p) bytes of the file at at into p, and notes where a
// read that met the end of the file ended (shortHere). Its error is a
// failed read's: at the end of the file it returns fewer bytes and nil.
func (d *Decoder) readAt(p []byte, at int64) (int, error) {
	n, err := d.r.ReadAt(p, at)
	// A read that failed after some bytes did not meet the end of the
	// data: what it left out is no torn frame.
	if err != nil && !errors.Is(err, io.EOF) {
		return n, fmt.Errorf("streamfile: read at offset %d: %w", at+int64(n), err)
	}
	if n < len(p) {
		d.shortAt, d.shortIn = at+int64(n), d.nexts
	}
	return n, nil
}

// keepSize is the largest read buffer or payload scratch the decoder keeps
// from one call of Next to the next: four reads (1 MiB by default), and so
// a frame as large as the default beacon interval.
func (d *Decoder) keepSize() int {
	return 4 * max(d.readSize(), defaultReadSize)
}

// release lets go of the read buffer and the payload scratch when a frame
// larger than keepSize grew them, now that the caller is past it (its
// payload was valid until this call): kept, they would hold the memory of
// the largest frame read for as long as the decoder lives. Bytes the
// buffer read past the frame are read again.
func (d *Decoder) release() {
	big := len(d.rec.Payload) > d.keepSize()
	if cap(d.scratch) > d.keepSize() {
		d.scratch, big = nil, true
	}
	if cap(d.buf) > d.keepSize() {
		// Reading from the position again, the bytes read when the
		// file last ended are read anew too: none is kept.
		d.buf, d.bufOff, d.shortAt, big = nil, d.pos, -1, true
	}
	if big {
		d.rec.Payload = nil
	}
}

// grow replaces the full buffer with a larger one that keeps only the bytes
// from the current frame's start on (all of them when the buffer starts
// later, past a payload read straight from the file: see take). Slices of
// the old buffer handed out during this frame stay valid. The capacity
// doubles from 4 KiB up to the read size, or fits the frame if it is
// larger.
func (d *Decoder) grow(end int64) {
	keep := d.buf[max(d.pos-d.bufOff, 0):]
	size := max(end-d.bufOff-int64(len(d.buf))+int64(len(keep)), int64(min(d.readSize(), max(4096, 2*cap(d.buf)))))
	nb := make([]byte, len(keep), size)
	copy(nb, keep)
	d.bufOff += int64(len(d.buf) - len(keep))
	d.buf = nb
}

// SkipDamage moves the position past the bytes fe says are not a frame,
// to where a reader that skips damage goes on in data of the given size
// ([SkipDamage]): the first whole frame after them before the next beacon,
// else the frame boundary a beacon after them gives. It reports false,
// the position unchanged, when the data holds no such frame yet.
func (d *Decoder) SkipDamage(fe *FormatError, size int64) (bool, error) {
	p, err := SkipDamage(d.r, Header{BeaconInterval: uint32(d.interval)}, max(d.pos, fe.Offset), size)
	if err != nil || p < 0 {
		return false, err
	}
	d.pos = p
	d.compact()
	return true, nil
}

// resync returns the frame boundary reached from the beacon at boundary b
// (spec §6.5): skip the rest of the frame that the beacon interrupts, through
// further beacons when it spans them.
//
// Beacons carry no checksum: a beacon that follows another within one frame
// must count what the first one counted, less the frame bytes between them,
// or resync reports a [*FormatError] at it rather than skipping frames.
func (d *Decoder) resync(b int64) (int64, error) {
	if !d.have(b, 1) {
		d.buf, d.bufOff = d.buf[:0], b // never read the bytes in between
	}
	left := int64(-1) // what the beacon before said remains of the frame, if it spans b
	for {
		n, err := d.readBeacon(b)
		if err == nil && left >= 0 && int64(d.beacon.Remaining) != left {
			err = &FormatError{Offset: b, Reason: fmt.Sprintf("beacon says %d bytes of the frame it interrupts remain, the beacon before it said %d (a damaged beacon)", d.beacon.Remaining, left)}
		}
		if err != nil {
			if d.bufOff > d.pos {
				// The buffer must start at or before the position for a
				// later Next.
				d.buf, d.bufOff = d.buf[:0], d.pos
			}
			return 0, err
		}
		skip := min(int64(d.beacon.Remaining), d.interval-int64(n))
		p := b + int64(n) + skip
		if !d.atBoundary(p) {
			return p, nil
		}
		b, left = p, int64(d.beacon.Remaining)-skip
	}
}
