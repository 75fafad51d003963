package offsets

import (
	"bytes"
	"errors"
	"io"
	"os"

	"github.com/streamd/streamd/internal/durable"
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

// writeAtomically replaces the sidecar at path with data, atomically and
// durably (see [durable.Replace]). The directory lock makes this process the
// only writer of the temporary file.
func writeAtomically(path string, data []byte) error {
	_, err := durable.Replace(path, sidecarMode, func(f *os.File) error {
		failpoint.TornWrite(failpoint.OffsetsWrite, f, data, 0) // crash tests: a torn temporary sidecar
		_, err := f.Write(data)
		return err
	}, func() {
		failpoint.Hit(failpoint.OffsetsCommit) // crash tests: a complete temporary sidecar, not renamed
	})
	return err
}
