package tail

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// DefaultRotationGrace is how long a follower reads on in a file renamed
// away from the path once another took it, for a writer that appends to
// the old file a little longer: a stream's rotation_grace unless
// configured, and Print's.
const DefaultRotationGrace = 5 * time.Second

// Print writes the messages of the file at path to out in format p as a
// [Follower] delivers them, until the end of stream or until ctx ends
// (both nil). What was read is written out before the follower waits for
// the file to grow: at once on a quiet file, in large writes while it
// catches up. A file's header line comes before its messages, again after
// another file took the path; beacons are not printed. Damage stops it
// (StopOnCorrupt) after its error line, with the error. A failure to open
// the file is returned as it is, a failure to write as a
// [*streamfile.WriteError].
func Print(ctx context.Context, out io.Writer, path string, p streamfile.Format, logger *slog.Logger) error {
	// The first failure to write sticks in w: every later Write and Flush
	// returns it, so the one of a flush before a wait is not lost.
	w := bufio.NewWriterSize(out, 64<<10)
	fl, err := New(Options{Path: path, OnCorrupt: StopOnCorrupt, RotationGrace: DefaultRotationGrace, Logger: logger, OnWait: func() { w.Flush() }})
	if err != nil {
		return err
	}
	defer fl.Close()
	file := fl.Position().File
	var line []byte
	if h := fl.Header(); h.BeaconInterval != 0 {
		line = p.AppendHeader(line, &h)
	}
	for {
		if _, err := w.Write(line); err != nil {
			return &streamfile.WriteError{Err: err}
		}
		line = line[:0]
		r, err := fl.Next(ctx)
		switch {
		case err == nil:
			if r.File != file {
				h := fl.Header()
				line, file = p.AppendHeader(line, &h), r.File
			}
			line = p.AppendRecord(line, r.Record)
			continue
		case errors.Is(err, io.EOF), errors.Is(err, context.Canceled):
			err = nil
		default:
			// A follower waits at a torn tail: err is damage or a failure.
			w.Write(p.AppendError(line, err, 0, 0)) // a failure shows in Flush
		}
		if ferr := w.Flush(); ferr != nil {
			return errors.Join(err, &streamfile.WriteError{Err: ferr})
		}
		return err
	}
}
