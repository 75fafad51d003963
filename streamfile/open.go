package streamfile

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// NotRegularError is a file that is neither a regular file nor a
// directory: a named pipe, a device. A stream file is a regular file.
type NotRegularError struct {
	Path string
	Mode fs.FileMode
}

func (e *NotRegularError) Error() string {
	return fmt.Sprintf("streamfile: %s is not a regular file (%s): a stream file is one, read and written by seeking in it", e.Path, e.Mode.Type())
}

// OpenRegular opens the file at path for reading, as [os.Open] does, if it
// is a regular file, as a stream file is. A named pipe or a device is
// refused with a [*NotRegularError], a directory with the
// [*fs.PathError] an open for writing gets (syscall.EISDIR).
func OpenRegular(path string) (*os.File, error) {
	return openRegular(path, os.O_RDONLY, 0)
}

// openRegular opens path with flags (and perm, for a file that O_CREATE
// creates) if it is a regular file, refusing anything else as
// [OpenRegular] does. A stat before the open refuses what is there without
// opening it (a device may act on its open: a watchdog arms); the check of
// the open file refuses what took the path in between. That open cannot
// wait (a named pipe's for its other end, a terminal's for its carrier):
// it is made with O_NONBLOCK, cleared once the file is known to be
// regular, and O_NOCTTY keeps a terminal from becoming the process's
// controlling terminal.
func openRegular(path string, flags int, perm fs.FileMode) (*os.File, error) {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() && !fi.IsDir() {
		return nil, &NotRegularError{Path: path, Mode: fi.Mode()}
	}
	f, err := os.OpenFile(path, flags|syscall.O_NONBLOCK|syscall.O_NOCTTY, perm)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f, path); err != nil {
		f.Close() // opened only to be looked at: nothing to report
		return nil, err
	}
	if err := syscall.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return f, nil
}

// checkRegular refuses the file f, opened at path, unless it is a regular
// file: a directory with the error an open for writing gets, anything
// else with a [*NotRegularError].
func checkRegular(f *os.File, path string) error {
	fi, err := f.Stat()
	switch {
	case err != nil:
		return err
	case fi.IsDir():
		return &fs.PathError{Op: "open", Path: path, Err: syscall.EISDIR}
	case !fi.Mode().IsRegular():
		return &NotRegularError{Path: path, Mode: fi.Mode()}
	}
	return nil
}
