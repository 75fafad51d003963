package streamfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// CheckBeaconInterval says whether n is a beacon interval streamd creates
// files with: a positive multiple of 1024, at most 2 GiB.
func CheckBeaconInterval(n int64) error {
	if n <= 0 || n%1024 != 0 || n > 1<<31 {
		return fmt.Errorf("invalid beacon interval %d: use a positive multiple of 1024", n)
	}
	return nil
}

// Layout constants of format version 1 (spec §3–§7).
const (
	HeaderSize = 128
	// MinBeaconInterval is the smallest interval any reader accepts.
	MinBeaconInterval = 128
	// DefaultBeaconInterval is the upstream default (1 MiB).
	DefaultBeaconInterval = 1 << 20
	// MaxKeyLen is the longest valid stream key in bytes.
	MaxKeyLen = 249
	// MaxFileNameLen is the longest file name the 128-byte header can hold.
	MaxFileNameLen = 111
	// maxTimestampMs is 9999-12-31T23:59:59.999Z, the upstream reader's limit.
	maxTimestampMs = 253402300799999

	frameOverhead  = 32 // key length byte, shard, seq, timestamp, size, checksum, trailer
	markerOverhead = 27 // key length byte, shard, seq, timestamp, running checksum
	maxMarkerSize  = 282
	beaconOverhead = 7 // start, remaining, count, end
	trailer        = 0x0D

	// EOSKey and EOSPayload mark the end of a stream (spec §7).
	EOSKey     = "SEA_STREAMER_INTERNAL"
	EOSPayload = "EOS"

	// WildcardKey is the key upstream subscribes with to read every
	// stream (spec §7); a record under it is read by no one.
	WildcardKey = "SEA_STREAMER_WILDCARD"
)

var (
	magic = [3]byte{'S', 's', 0x01}

	// ErrTruncated reports that the data ends inside a header, frame or
	// beacon: a live file is still being written, a finished one was cut.
	ErrTruncated = errors.New("streamfile: truncated: need more bytes")
)

// Header is the 128-byte file header.
type Header struct {
	FileName       string
	CreatedAtMs    uint64
	BeaconInterval uint32
}

// Frame is one message of a stream file. When returned by a [Decoder], Payload
// aliases the decoder's buffer and is valid until the next call.
type Frame struct {
	Key         string
	Shard       uint64
	Seq         uint64
	TimestampMs uint64
	Payload     []byte
}

// IsEOS reports whether f is the end-of-stream mark (spec §7).
func (f *Frame) IsEOS() bool {
	return f.Key == EOSKey && string(f.Payload) == EOSPayload
}

// Size is the number of logical bytes the frame occupies.
func (f *Frame) Size() int64 { return int64(len(f.Key) + len(f.Payload) + frameOverhead) }

// Marker is one stream's entry in a beacon (spec §6.3).
type Marker struct {
	Key             string
	Shard           uint64
	Seq             uint64
	TimestampMs     uint64
	RunningChecksum uint16
}

// Beacon is the index record found at every multiple of the beacon interval.
type Beacon struct {
	Remaining uint32
	Markers   []Marker
}

// Size is the number of bytes the beacon occupies in the file.
func (b *Beacon) Size() int {
	n := beaconOverhead
	for i := range b.Markers {
		n += len(b.Markers[i].Key) + markerOverhead
	}
	return n
}

// FormatError is a violation of the file format at a known offset.
type FormatError struct {
	Offset int64
	Reason string
	// PayloadSize is, for a frame whose payload size is over the decoder's
	// limit, that size: a record another writer may have written whole,
	// or a damaged size field. 0 otherwise.
	PayloadSize int64
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("streamfile: format error at offset %d: %s", e.Offset, e.Reason)
}

// ChecksumError reports a frame whose stored checksum does not match its
// payload. The framing is intact: decoding can continue after it. Its text
// writes the checksums in decimal, as streamd decode prints them.
type ChecksumError struct {
	Offset   int64 // start of the frame
	End      int64 // offset after the frame
	Key      string
	Seq      uint64
	Received uint16 // stored in the file
	Computed uint16 // over the payload read
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("streamfile: checksum mismatch in frame at offset %d (key %q, seq %d): stored %d, computed %d",
		e.Offset, e.Key, e.Seq, e.Received, e.Computed)
}

// ValidKey reports why key is not a valid stream key, or nil: 1 to 249 bytes
// of [A-Za-z0-9._-].
func ValidKey(key string) error {
	if key == "" {
		return errors.New("stream key must be non-empty")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("stream key is %d bytes long, the limit is %d", len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if !keyByte(key[i]) {
			return fmt.Errorf("stream key %q has character %q at byte %d; allowed are A-Z a-z 0-9 . _ -", key, key[i], i)
		}
	}
	return nil
}

// ReservedKey returns an error naming key when the format reserves it (spec
// §8): a record under [EOSKey] with payload [EOSPayload] ends every reader
// there, and [WildcardKey] is no stream. Writers of records refuse both.
func ReservedKey(key string) error {
	switch key {
	case EOSKey:
		return fmt.Errorf("stream key %q is reserved for the end-of-stream mark, which would stop every reader there; use another key", key)
	case WildcardKey:
		return fmt.Errorf("stream key %q is reserved for subscribing to every stream; use another key", key)
	}
	return nil
}

func keyByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// quoteKey quotes the bytes of an invalid stream key for an error: at most
// its first 16, since they are often other records' bytes, which logs
// should not spread.
func quoteKey[K string | []byte](key K) string {
	const shown = 16
	if len(key) <= shown {
		return fmt.Sprintf("%q", key)
	}
	return fmt.Sprintf("%q... (%d bytes)", key[:shown], len(key))
}

// validKeyBytes is the read-side check: the upstream reader accepts the empty
// key (spec §8).
func validKeyBytes(b []byte) bool {
	if len(b) > MaxKeyLen {
		return false
	}
	for _, c := range b {
		if !keyByte(c) {
			return false
		}
	}
	return true
}

// Validate reports whether h can be written.
func (h *Header) Validate() error {
	if len(h.FileName) > MaxFileNameLen {
		return fmt.Errorf("streamfile: header file name is %d bytes long, the limit is %d", len(h.FileName), MaxFileNameLen)
	}
	if !utf8.ValidString(h.FileName) {
		return errors.New("streamfile: header file name is not valid UTF-8")
	}
	if h.BeaconInterval < MinBeaconInterval {
		return fmt.Errorf("streamfile: beacon interval %d is below the minimum %d", h.BeaconInterval, MinBeaconInterval)
	}
	return nil
}

// AppendHeader appends the 128-byte encoding of h to dst.
func AppendHeader(dst []byte, h *Header) ([]byte, error) {
	if err := h.Validate(); err != nil {
		return dst, err
	}
	dst = append(dst, magic[:]...)
	dst = append(dst, byte(len(h.FileName)))
	dst = append(dst, h.FileName...)
	dst = binary.BigEndian.AppendUint64(dst, h.CreatedAtMs)
	dst = binary.BigEndian.AppendUint32(dst, h.BeaconInterval)
	pad := 112 - len(h.FileName)
	for range pad - 1 {
		dst = append(dst, 0)
	}
	return append(dst, trailer), nil
}

// ParseHeader decodes the header at the start of b. It returns ErrTruncated
// when b is shorter than 128 bytes.
func ParseHeader(b []byte) (Header, error) {
	if len(b) >= 2 && (b[0] != magic[0] || b[1] != magic[1]) {
		return Header{}, &FormatError{Offset: 0, Reason: fmt.Sprintf("not a stream file: magic bytes are %#02x %#02x, want 0x53 0x73 (\"Ss\")", b[0], b[1])}
	}
	if len(b) >= 3 && b[2] != magic[2] {
		return Header{}, &FormatError{Offset: 2, Reason: fmt.Sprintf("unsupported format version %d, want 1", b[2])}
	}
	if len(b) < HeaderSize {
		return Header{}, ErrTruncated
	}
	l := int(b[3])
	if l > MaxFileNameLen {
		return Header{}, &FormatError{Offset: 3, Reason: fmt.Sprintf("file name length %d does not fit the header (max %d)", l, MaxFileNameLen)}
	}
	name := b[4 : 4+l]
	if !utf8.Valid(name) {
		return Header{}, &FormatError{Offset: 4, Reason: "file name is not valid UTF-8"}
	}
	h := Header{
		FileName:       string(name),
		CreatedAtMs:    binary.BigEndian.Uint64(b[4+l:]),
		BeaconInterval: binary.BigEndian.Uint32(b[12+l:]),
	}
	if h.BeaconInterval < MinBeaconInterval {
		return Header{}, &FormatError{Offset: int64(12 + l), Reason: fmt.Sprintf("beacon interval %d is below the minimum %d", h.BeaconInterval, MinBeaconInterval)}
	}
	return h, nil
}

// appendFrameHead appends the fields of f that precede its payload: the
// key, shard, sequence, timestamp and payload size.
func appendFrameHead(dst []byte, f *Frame) []byte {
	dst = append(dst, byte(len(f.Key)))
	dst = append(dst, f.Key...)
	dst = binary.BigEndian.AppendUint64(dst, f.Shard)
	dst = binary.BigEndian.AppendUint64(dst, f.Seq)
	dst = binary.BigEndian.AppendUint64(dst, f.TimestampMs)
	return binary.BigEndian.AppendUint32(dst, uint32(len(f.Payload)))
}

// appendBeacon appends the encoding of b to dst.
func appendBeacon(dst []byte, b *Beacon) []byte {
	dst = append(dst, trailer)
	dst = binary.BigEndian.AppendUint32(dst, b.Remaining)
	dst = append(dst, byte(len(b.Markers)))
	for i := range b.Markers {
		m := &b.Markers[i]
		dst = append(dst, byte(len(m.Key)))
		dst = append(dst, m.Key...)
		dst = binary.BigEndian.AppendUint64(dst, m.Shard)
		dst = binary.BigEndian.AppendUint64(dst, m.Seq)
		dst = binary.BigEndian.AppendUint64(dst, m.TimestampMs)
		dst = binary.BigEndian.AppendUint16(dst, m.RunningChecksum)
	}
	return append(dst, trailer)
}

// markersPerBeacon is M of spec §6.3: half of what fits into one interval.
func markersPerBeacon(interval uint32) int {
	space := int(interval)
	if space < beaconOverhead {
		return 0
	}
	return min(255, (space-beaconOverhead)/maxMarkerSize) / 2
}
