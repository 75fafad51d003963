package streamfile

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openRegularWithin calls OpenRegular(path) on a goroutine and returns what
// it returned, failing the test when it has not returned within 10 s: an
// open that blocks (a named pipe without a writer) would hang the test.
func openRegularWithin(t *testing.T, path string) (*os.File, error) {
	t.Helper()
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := OpenRegular(path)
		done <- result{f, err}
	}()
	select {
	case r := <-done:
		if r.f != nil {
			t.Cleanup(func() { r.f.Close() })
		}
		return r.f, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("OpenRegular(%s) has not returned after 10 s: the open blocks", path)
		return nil, nil
	}
}

// TestOpenRegularReads: a regular file opened by OpenRegular reads as one
// opened by os.Open: whole, with ReadAt too, and io.EOF at its end; the
// O_NONBLOCK of its open is cleared.
func TestOpenRegularReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	want := make([]byte, 3<<20+17) // more than one read's worth
	rng := rand.NewChaCha8([32]byte{1})
	rng.Read(want)
	if err := os.WriteFile(path, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := openRegularWithin(t, path)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var flags int
	var ferr error
	if err := raw.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil || ferr != nil {
		t.Fatal(err, ferr)
	}
	if flags&unix.O_NONBLOCK != 0 {
		t.Errorf("file status flags %#x: O_NONBLOCK left set", flags)
	}

	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, %v; want the file's %d bytes", len(got), err, len(want))
	}
	if n, err := f.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Errorf("read at the end: %d, %v; want 0, io.EOF", n, err)
	}
	b := make([]byte, 4096)
	if n, err := f.ReadAt(b, 1<<20); n != len(b) || err != nil || !bytes.Equal(b, want[1<<20:1<<20+len(b)]) {
		t.Errorf("ReadAt at 1 MiB: %d, %v, or other bytes than the file's", n, err)
	}
	if n, err := f.ReadAt(b, int64(len(want))-10); n != 10 || err != io.EOF {
		t.Errorf("ReadAt across the end: %d, %v; want 10, io.EOF", n, err)
	}
}

// TestOpenRegularRefuses: a named pipe (without a writer, whose open would
// otherwise wait for one) and a device are refused at once with a
// *NotRegularError naming the path; a directory with the *fs.PathError
// that an open for writing gets; a missing file with fs.ErrNotExist.
func TestOpenRegularRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.ss")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, os.DevNull} {
		f, err := openRegularWithin(t, path)
		nr, ok := errors.AsType[*NotRegularError](err)
		if f != nil || !ok || nr.Path != path || nr.Mode.IsRegular() {
			t.Errorf("OpenRegular(%s) = %v, %v; want a *NotRegularError for it", path, f, err)
		}
	}

	f, err := openRegularWithin(t, dir)
	pe, ok := errors.AsType[*fs.PathError](err)
	if f != nil || !ok || pe.Op != "open" || pe.Path != dir || !errors.Is(err, syscall.EISDIR) {
		t.Errorf("OpenRegular(directory) = %v, %v; want open %s: is a directory", f, err, dir)
	}
	if _, werr := os.OpenFile(dir, os.O_RDWR, 0); err == nil || werr == nil || err.Error() != werr.Error() {
		t.Errorf("OpenRegular(directory) says %v, an open for writing %v: want the same", err, werr)
	}

	if f, err := openRegularWithin(t, filepath.Join(dir, "none.ss")); f != nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("OpenRegular(missing) = %v, %v; want fs.ErrNotExist", f, err)
	}

	// A named pipe put at the path after the stat is refused by what the
	// open file is.
	pipe, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()
	if _, ok := errors.AsType[*NotRegularError](checkRegular(pipe, fifo)); !ok {
		t.Errorf("checkRegular of an open named pipe: want a *NotRegularError")
	}
}
