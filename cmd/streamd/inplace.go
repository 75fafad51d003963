package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"github.com/streamd/streamd/streamfile"
)

// inPlace is a stream file that streamd decode maps into memory and decodes
// in place. Another process truncating the file meanwhile (a writer that
// repairs a torn end truncates it, then writes again) turns the lost bytes
// into zeros up to the end of their page and makes the pages past it fault;
// inPlace tells such a change apart from damage in the file.
type inPlace struct {
	f     *os.File
	h     streamfile.Header
	data  []byte
	unmap func() error
	dec   *streamfile.Decoder
}

// mapInPlace maps the first size bytes of f, or returns nil when the file
// cannot be mapped and is to be read instead.
func mapInPlace(f *os.File, h streamfile.Header, size int64) *inPlace {
	data, unmap, err := streamfile.MapFile(f, size)
	if err != nil {
		return nil
	}
	return &inPlace{f: f, h: h, data: data, unmap: unmap, dec: streamfile.NewBytesDecoder(data, h, streamfile.HeaderSize)}
}

const changedMessage = "streamd decode: %s: the file changed while it was decoded (another process truncated or rewrote it, as a writer repairing a torn end does); what was printed may be wrong: decode it again\n"

// changed reports whether the file changed under the mapping, so that err,
// the error that ended the decode, and maybe what was printed before it,
// cannot be trusted: the file is shorter than it was when mapped, or a
// checksum or format error does not show when its frame is read again from
// the file.
func (m *inPlace) changed(err error) bool {
	if fi, statErr := m.f.Stat(); statErr == nil && fi.Size() < int64(len(m.data)) {
		return true
	}
	at := m.dec.Pos() // a format error leaves the position at the bad frame
	var ce *streamfile.ChecksumError
	var fe *streamfile.FormatError
	switch {
	case errors.As(err, &ce):
		at = ce.Offset
	case errors.As(err, &fe):
	default:
		return false
	}
	_, again := streamfile.NewDecoder(m.f, m.h, at).Next()
	return again == nil || again.Error() != err.Error()
}

// fault reports a fault on the mapping, recovered as the panic e, and
// returns the exit code: the file changed under the mapping, or the page
// could not be read from the disk. Any other panic goes on.
func (m *inPlace) fault(e any, path string, errw io.Writer) int {
	fe, ok := e.(interface{ Addr() uintptr })
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))
	if !ok || fe.Addr() < base || fe.Addr()-base >= uintptr(len(m.data)) {
		panic(e)
	}
	off := int64(fe.Addr() - base)
	var b [1]byte
	if _, err := m.f.ReadAt(b[:], off); err == nil || errors.Is(err, io.EOF) || m.changed(nil) {
		fmt.Fprintf(errw, changedMessage, path)
		return exitError
	}
	fmt.Fprintf(errw, "streamd decode: %s: cannot read the file at offset %d: the page could not be read from the disk (I/O error)\n", path, off)
	return exitUsage
}
