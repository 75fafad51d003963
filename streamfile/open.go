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
// [*fs.PathError] an open for writing gets (syscall.EISDIR). The check is
// made on the open file, so no other file can take the path between the
// check and the open; and the open itself cannot block: it is made with
// O_NONBLOCK, without which opening a named pipe waits for a writer,
// forever if none comes. On Linux, O_NONBLOCK changes nothing for a
// regular file (open(2)), whose reads Go makes as blocking ones (the
// poller does not take regular files). O_NOCTTY keeps a terminal from
// becoming the process's controlling terminal on the way.
func OpenRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	if err := checkRegular(f, path); err != nil {
		f.Close() // opened only to be looked at: nothing to report
		return nil, err
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
