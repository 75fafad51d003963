package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// NoSpace reports whether err is a full file system or an exhausted quota:
// a write that may pass once there is room.
func NoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// TempPath returns the name of the temporary file through which [Replace]
// replaces path: path with ".tmp" appended, in the same directory, so that
// the rename never crosses file systems. A crash can leave it behind; the
// next Replace truncates it, and an owner that wants it gone at start can
// remove it: it never holds the only copy of anything.
func TempPath(path string) string { return path + ".tmp" }

// Replace replaces the file at path with what write writes to a new file,
// so that a crash at any instant leaves either the old content or the new
// one, and the new one survives power loss once Replace returns nil.
//
// write gets the temporary file [TempPath](path), created with perm (before
// the umask) or truncated if a crash left one. Replace then fsyncs and
// closes it, calls beforeRename if it is not nil (crash tests stop there,
// with the new content complete but not in place), renames it over path and
// fsyncs the directory. Only one process may replace path at a time: the
// temporary file has a fixed name.
//
// renamed reports whether path now names the new content. After an error
// with renamed false, path is untouched and the temporary file is gone;
// after an error with renamed true, the directory fsync failed and the
// rename may not survive a power loss.
func Replace(path string, perm fs.FileMode, write func(f *os.File) error, beforeRename func()) (renamed bool, err error) {
	tmp := TempPath(path)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return false, err
	}
	if err := finish(f, write); err != nil {
		return false, errors.Join(err, removeTemp(tmp))
	}
	if beforeRename != nil {
		beforeRename()
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, errors.Join(err, removeTemp(tmp))
	}
	return true, SyncDir(filepath.Dir(path))
}

// finish writes the temporary file f with write, fsyncs it and closes it.
// f is closed whatever happens.
func finish(f *os.File, write func(f *os.File) error) error {
	err := write(f)
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}

// removeTemp removes the temporary file of a replacement that failed. It is
// no error if it is gone already.
func removeTemp(tmp string) error {
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// SyncDir fsyncs the directory dir, making the changes to its entries (a
// rename, a new or removed file) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
