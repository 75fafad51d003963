package tail

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/streamd/streamd/streamfile"
)

// Print writes the messages of the file at path to out in format p as a
// [Follower] delivers them, each written out as soon as it is read,
// until the end of stream or until ctx ends (both nil). A file's header
// line comes before its messages, again after another file took the path;
// beacons are not printed. Damage stops it (StopOnCorrupt) after its error
// line, with the error. A failure to open the file is returned as it is, a
// failure to write as a [*streamfile.WriteError].
func Print(ctx context.Context, out io.Writer, path string, p streamfile.Format, logger *slog.Logger) error {
	fl, err := New(Options{Path: path, OnCorrupt: StopOnCorrupt, Logger: logger})
	if err != nil {
		return err
	}
	defer fl.Close()
	w := bufio.NewWriterSize(out, 64<<10)
	file := fl.Position().File
	var line []byte
	if h := fl.Header(); h.BeaconInterval != 0 {
		line = p.AppendHeader(line, &h)
	}
	for {
		w.Write(line)
		if err := w.Flush(); err != nil {
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
			return nil
		}
		// A follower waits at a torn tail: err is damage or a failure.
		w.Write(p.AppendError(line, err, 0, 0))
		if ferr := w.Flush(); ferr != nil {
			return errors.Join(err, &streamfile.WriteError{Err: ferr})
		}
		return err
	}
}
