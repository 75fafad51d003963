package streamfile

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
	"unicode/utf8"
)

// AppendOptions says how an [Appender] opens the file at its path.
type AppendOptions struct {
	// Create allows creating the file when it is missing. Its header then
	// holds the last element of the path (shortened as [Appender] says),
	// the time of creation and BeaconInterval.
	Create         bool
	BeaconInterval uint32
	// Mode is the permission bits of a file the Appender creates, as
	// [CreateOptions.Mode] says.
	Mode fs.FileMode
	// Log receives what the writer repairs on its own; nil discards it.
	Log *slog.Logger
}

// Appender appends batches to the stream file at a path, and follows the
// path when another file takes it, so that what it writes goes where the
// readers of the path look. It is how streamd publish and the daemon's
// retry copies write.
//
// Its [Writer] is opened with [CreateOptions.RefuseReplaced]: a batch that
// finds, under the file's lock, that the path names another file (one
// renamed over it, or the file deleted and created again) writes nothing
// and gets [ErrReplaced]. The Appender then opens the file now at the path
// as it opened the first, syncs the old one, so that what was written to
// it is durable, closes it, and writes the batch to the new file,
// continuing that file's sequence numbers. A batch that finds the file
// deleted and no file at the path ([ErrRemoved]) does the same with
// Create, which makes the file anew, and otherwise fails: written to the
// deleted file, it would reach no reader of the path. When the new file cannot be opened,
// or the old one cannot be synced, the batch fails and the Appender stays
// on the old file, to try again at the next batch.
//
// A file it creates has the last element of the path as its header's file
// name, as the upstream writer stores it (spec §3), but in ASCII: each byte
// of a non-ASCII character as %XX, so that every upstream reader parses the
// header. A longer name than the header holds ([MaxFileNameLen] bytes) is
// cut, at a character boundary, and ends in a hash of the whole name, so
// that the files of two streams whose long names begin alike are not taken
// for rotations of one another (see headerFileName).
//
// An Appender is not safe for concurrent use.
type Appender struct {
	path string
	opts AppendOptions
	w    *Writer
}

// OpenAppender opens the stream file at path for appending, creating it
// when it is missing and opts.Create is set.
func OpenAppender(path string, opts AppendOptions) (*Appender, error) {
	a := &Appender{path: path, opts: opts}
	w, err := a.open()
	if err != nil {
		return nil, err
	}
	a.w = w
	return a, nil
}

// open opens the file now at the path.
func (a *Appender) open() (*Writer, error) {
	return OpenWriter(a.path, CreateOptions{
		Create:         a.opts.Create,
		Mode:           a.opts.Mode,
		RefuseReplaced: true,
		Log:            a.opts.Log,
		Header: Header{
			FileName:       headerFileName(a.path),
			CreatedAtMs:    uint64(time.Now().UnixMilli()),
			BeaconInterval: a.opts.BeaconInterval,
		},
	})
}

// headerFileName returns the file name for the header of a file created at
// path: its last element in ASCII, each byte of a non-ASCII character
// written as %XX (upper-case hex). The upstream TypeScript reader places
// the fields after the name by its length in UTF-16 code units, which
// equals its length in bytes only for ASCII. A name longer than the header
// holds ([MaxFileNameLen] bytes) is cut before a character or a %XX that
// does not fit, leaving room for "~" and the CRC-32 of the whole last
// element in hexadecimal: rotations tell the files of a stream by the
// name in their headers, and two long names that begin alike must not
// read as one.
func headerFileName(path string) string {
	base := filepath.Base(path)
	if name, whole := encodeFileName(base, MaxFileNameLen); whole {
		return name
	}
	const mark = "~12345678"
	name, _ := encodeFileName(base, MaxFileNameLen-len(mark))
	return fmt.Sprintf("%s~%08x", name, crc32.ChecksumIEEE([]byte(base)))
}

// encodeFileName returns name in ASCII, each byte of a non-ASCII character
// written as %XX (upper-case hex), cut to at most limit bytes before a
// character or a %XX that does not fit, and whether all of it fit.
func encodeFileName(name string, limit int) (string, bool) {
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, limit)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < utf8.RuneSelf {
			if len(out)+1 > limit {
				return string(out), false
			}
			out = append(out, c)
			continue
		}
		// A non-ASCII character goes whole or not at all.
		n := 1
		for i+n < len(name) && name[i+n] >= utf8.RuneSelf && !utf8.RuneStart(name[i+n]) {
			n++
		}
		if len(out)+3*n > limit {
			return string(out), false
		}
		for _, c := range []byte(name[i : i+n]) {
			out = append(out, '%', hex[c>>4], hex[c&15])
		}
		i += n - 1
	}
	return string(out), true
}

// Publish writes frames in one batch to the file at the path, as
// [Writer.Publish] does, following the path to the file that took it. A
// write that fails part way returns the [*AppendError] of Writer.Publish,
// which counts the frames it left whole.
func (a *Appender) Publish(frames []Frame) error {
	err := a.w.Publish(frames)
	if !errors.Is(err, ErrReplaced) && !(errors.Is(err, ErrRemoved) && a.opts.Create) {
		return err
	}
	if err := a.follow(); err != nil {
		return err
	}
	return a.w.Publish(frames)
}

// follow leaves the open file, which another one replaced at the path, for
// the file now at the path.
func (a *Appender) follow() error {
	w, err := a.open()
	if err != nil {
		return fmt.Errorf("streamfile: %s was replaced or deleted, and the file at the path cannot be opened for appending: %w", a.path, err)
	}
	if err := a.w.Sync(); err != nil {
		return errors.Join(fmt.Errorf("streamfile: %s was replaced, and the old file cannot be synced: %w", a.path, err), w.Close())
	}
	a.w.Close() // what was written to it is durable: a failed close loses nothing
	a.w = w
	return nil
}

// FollowPath moves to the file now at the path when another file took it,
// as the next batch would: the file left (a rotation's, compressed or
// removed soon after) is not kept open, nor its disk space taken, until a
// batch comes. With no file at the path, or one that cannot be opened for
// appending yet (its header not written), it stays, and the next batch
// decides.
func (a *Appender) FollowPath() error {
	st, err := os.Stat(a.path)
	if err != nil {
		return nil
	}
	if cur, err := a.w.Stat(); err != nil || os.SameFile(st, cur) {
		return nil
	}
	return a.follow()
}

// Writer returns the writer of the file open now. It changes when a batch
// follows the path to another file, which closes the old writer.
func (a *Appender) Writer() *Writer { return a.w }

// Sync flushes the file open now to stable storage.
func (a *Appender) Sync() error { return a.w.Sync() }

// Close closes the file open now.
func (a *Appender) Close() error { return a.w.Close() }
