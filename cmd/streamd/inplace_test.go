package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/streamd/streamd/streamfile"
)

// decodeToError decodes m to the first error and returns it.
func decodeToError(t *testing.T, m *inPlace) error {
	t.Helper()
	for {
		if _, err := m.dec.Next(); err != nil {
			return err
		}
	}
}

// inPlaceOver returns an inPlace that decodes data, in the heap, as if it
// were the mapping of the file at path.
func inPlaceOver(t *testing.T, path string, data []byte) *inPlace {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		t.Fatal(err)
	}
	return &inPlace{f: f, h: h, data: data, unmap: func() error { return nil }, dec: streamfile.NewBytesDecoder(data, h, streamfile.HeaderSize)}
}

// TestInPlaceChanged: a checksum error that the file itself does not have
// (the mapping saw bytes that changed since) is a change, not damage; one
// that the file has is damage.
func TestInPlaceChanged(t *testing.T) {
	good := filepath.Join(vectorDir, "consumer.ss")
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := streamfile.ReadHeader(bytes.NewReader(data))
	first, err := streamfile.NewBytesDecoder(data, h, streamfile.HeaderSize).Next()
	if err != nil {
		t.Fatal(err)
	}
	seen := bytes.Clone(data)
	seen[first.End-3] ^= 0xFF // what the mapping saw: the first frame's stored checksum differs
	m := inPlaceOver(t, good, seen)
	var ce *streamfile.ChecksumError
	if err := decodeToError(t, m); !errors.As(err, &ce) || !m.changed(err) {
		t.Fatalf("a checksum error the file does not have: %v, changed %v; want a checksum error and a change", err, m.changed(err))
	}

	bad := filepath.Join(vectorDir, "edge-c-badcrc.ss")
	data, err = os.ReadFile(bad)
	if err != nil {
		t.Fatal(err)
	}
	m = inPlaceOver(t, bad, data)
	if err := decodeToError(t, m); !errors.As(err, &ce) || m.changed(err) {
		t.Fatalf("the checksum error of a damaged file: %v, changed %v; want a checksum error and no change", err, m.changed(err))
	}
}

// addrFault is a recovered fault at an address, as SetPanicOnFault makes.
type addrFault uintptr

func (a addrFault) Error() string { return "fault" }
func (a addrFault) Addr() uintptr { return uintptr(a) }
func (a addrFault) RuntimeError() {}

// TestInPlaceFault: a fault inside the mapping whose byte the file can give
// is a change under the mapping; a fault elsewhere (a bug, not the file)
// panics on.
func TestInPlaceFault(t *testing.T) {
	path := filepath.Join(vectorDir, "consumer.ss")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := inPlaceOver(t, path, data)
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	var errw strings.Builder
	if code := m.fault(addrFault(base+200), "consumer.ss", &errw); code != exitError || !strings.Contains(errw.String(), "changed while it was decoded") {
		t.Fatalf("fault inside the mapping: exit %d, %q", code, errw.String())
	}
	defer func() {
		if e := recover(); e != addrFault(8) {
			t.Fatalf("a fault outside the mapping: recovered %v, want it to panic on", e)
		}
	}()
	m.fault(addrFault(8), "consumer.ss", &errw)
}
