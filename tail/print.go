package tail

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/streamd/streamd/streamfile"
)

// Print writes the messages of the file at path to w in format p as a
// [Follower] delivers them, flushing w whenever it has to wait, until the
// end of stream or until ctx ends (both nil). A file's header line comes
// before its messages, again after another file took the path; beacons are
// not printed. Damage stops it (StopOnCorrupt) after its error line, with
// the error. A failure to open the file, or to write to w, is returned as
// it is; a write error is a [*WriteError].
func Print(ctx context.Context, w *bufio.Writer, path string, p streamfile.Format, logger *slog.Logger) error {
	fl, err := New(Options{Path: path, OnCorrupt: StopOnCorrupt, Logger: logger})
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
		w.Write(line)
		if err := w.Flush(); err != nil {
			return &WriteError{err}
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
			return nil
		}
		// A follower waits at a torn tail: err is damage or a failure.
		w.Write(p.AppendError(line, err, 0, 0))
		return errors.Join(err, w.Flush())
	}
}

// WriteError is a failure to write what [Print] printed.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return fmt.Sprintf("write output: %v", e.Err) }

func (e *WriteError) Unwrap() error { return e.Err }
