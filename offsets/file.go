package offsets

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"

	"github.com/streamd/streamd/internal/failpoint"
)

// maxSidecarSize bounds what readSidecar reads: at a few hundred bytes per
// subscription, 16 MiB is tens of thousands of subscriptions, and a larger
// file is not a sidecar.
const maxSidecarSize = 16 << 20

// sidecarMode is the permission of a new sidecar, before the umask.
const sidecarMode = 0o644

// readSidecar returns the content of the sidecar at path, cut after
// maxSidecarSize+1 bytes so that decode can tell a file too large to be a
// sidecar without reading all of it.
func readSidecar(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	// The size is a hint that saves reallocations, so a failed Stat is no
	// reason to fail.
	if fi, err := f.Stat(); err == nil {
		buf.Grow(int(min(fi.Size(), maxSidecarSize)) + bytes.MinRead)
	}
	_, err = buf.ReadFrom(io.LimitReader(f, maxSidecarSize+1))
	return buf.Bytes(), errors.Join(err, f.Close())
}

// writeAtomically replaces the file at path with data so that a crash at
// any instant leaves either the old or the new content, and the new content
// survives power loss once it returns: write a temporary file in the same
// directory, fsync and close it, rename it over path, fsync the directory.
// The temporary file has a fixed name (path + ".tmp"): the directory lock
// makes this process its only writer, and one left by a crash is truncated
// by the next call. It is removed on every error path.
func writeAtomically(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, sidecarMode)
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			if rmErr := os.Remove(tmp); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
				err = errors.Join(err, rmErr)
			}
		}
	}()
	failpoint.TornWrite(failpoint.OffsetsWrite, f, data, 0) // crash tests: a torn temporary sidecar
	if _, err := f.Write(data); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Sync(); err != nil {
		return errors.Join(err, f.Close())
	}
	if err := f.Close(); err != nil {
		return err
	}
	failpoint.Hit(failpoint.OffsetsCommit) // crash tests: a complete temporary sidecar, not renamed
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	renamed = true
	return syncDir(filepath.Dir(path))
}

// syncDir fsyncs the directory dir, making a rename in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
