package streamfile

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MapFile maps the first size bytes of f into memory, read-only, to be
// decoded in place by [NewBytesDecoder]: a file in the page cache is then
// decoded without copying it. Nothing read from data may be used after
// unmap.
//
// A mapped file that another process truncates reads as zeros from its new
// end to the end of that page, and faults (SIGBUS) on the pages past it. A
// caller that may meet such a file turns the fault into a panic with
// [runtime/debug.SetPanicOnFault], recovers from it, and checks the file
// again before it trusts an error; followers of live files read through
// [NewDecoder].
func MapFile(f *os.File, size int64) (data []byte, unmap func() error, err error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, nil, fmt.Errorf("streamfile: map %s: cannot map %d bytes", f.Name(), size)
	}
	data, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("streamfile: map %s: %w", f.Name(), err)
	}
	// A hint for files read from disk: read ahead further, drop pages behind.
	_ = unix.Madvise(data, unix.MADV_SEQUENTIAL)
	return data, func() error { return unix.Munmap(data) }, nil
}
