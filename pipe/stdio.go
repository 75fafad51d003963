package pipe

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"
)

// MaxLineBytes bounds one input line of a [NewReader]; a longer line is a
// [*LineTooLongError].
const MaxLineBytes = 16 << 20

// ErrClosed reports that the reader of the output, the next stage of the
// pipeline, closed its end: the stage stops, as a producer whose reader
// went away does.
var ErrClosed = errors.New("stdout was closed by the next stage")

// ErrFailed reports that a write of the output failed for another reason
// than its reader going away (a full disk): the output takes no more
// lines, since the failed write may have left part of its line, with which
// a later line would be read as one.
var ErrFailed = errors.New("writing stdout failed")

// ErrEmpty is the stdio transport's refusal of an empty message: the format
// cannot carry one (settlement.md §8.2).
var ErrEmpty = errors.New("stdio drops empty lines; an empty message cannot be transmitted")

// LineTooLongError is an input line longer than the [Reader]'s limit. The
// Reader passes over the rest of it: the next call of Next returns the
// line after it.
type LineTooLongError struct {
	Line  int // its number, counting from 1
	Limit int // the longest line the Reader returns, in bytes
}

func (e *LineTooLongError) Error() string {
	return fmt.Sprintf("stdin line %d is longer than %d bytes", e.Line, e.Limit)
}

// Reader reads the lines of stdio input: a pipe stage's, and what
// `streamd publish` appends.
type Reader struct {
	r     *bufio.Reader
	limit int
	long  []byte
	n     int  // lines returned, too long ones included
	skip  bool // the rest of a too long line is still to be read
	done  bool
	cut   bool // the last line returned ended without '\n'
}

// NewReader returns a Reader of in whose lines are at most [MaxLineBytes]
// long.
func NewReader(in io.Reader) *Reader { return NewReaderLimit(in, MaxLineBytes) }

// NewReaderLimit returns a Reader of in whose lines are at most limit
// bytes long, '\n' not counted. It holds up to limit bytes of a line, and
// no more of a longer one.
func NewReaderLimit(in io.Reader, limit int) *Reader {
	return &Reader{r: bufio.NewReaderSize(in, 64<<10), limit: limit}
}

// Next returns the next line without its '\n', valid until the next call.
// A last line without '\n' is a line; the end of the input is io.EOF. A
// line longer than the limit is a [*LineTooLongError], returned as soon as
// the limit is passed; the next call reads past the rest of that line,
// without holding it, and returns the line after it.
func (r *Reader) Next() ([]byte, error) {
	line, _, err := r.next()
	return line, err
}

// Take is [Reader.Next] for a caller that keeps the line: the Reader never
// uses its memory again. A line longer than the read buffer, which the
// Reader puts together in memory of its own, is not copied once more.
func (r *Reader) Take() ([]byte, error) {
	line, own, err := r.next()
	if err != nil || own {
		return line, err
	}
	return bytes.Clone(line), nil
}

// next returns the next line as [Reader.Next] does, and whether it is in
// memory of its own rather than in the read buffer.
func (r *Reader) next() (line []byte, own bool, err error) {
	if r.skip {
		if err := r.skipLine(); err != nil {
			return nil, false, err
		}
	}
	for !r.done {
		chunk, err := r.r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			if len(r.long)+len(chunk) > r.limit {
				r.skip = true
				return nil, false, r.tooLong()
			}
			r.long = append(r.long, chunk...)
			continue
		case errors.Is(err, io.EOF):
			r.done = true
		case err != nil:
			return nil, false, readError(err)
		}
		line, own := chunk, r.long != nil
		if own {
			line = append(r.long, chunk...)
			r.long = nil
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(line) > r.limit {
			return nil, false, r.tooLong()
		}
		if len(line) > 0 || err == nil {
			r.n++
			r.cut = err != nil
			return line, own, nil
		}
	}
	return nil, false, io.EOF
}

// Unterminated reports whether the last line returned ended at the end of
// the input without '\n': a line, but perhaps one its writer was stopped in
// the middle of.
func (r *Reader) Unterminated() bool { return r.cut }

// tooLong drops what the Reader holds of the line it counts as too long,
// and returns its error.
func (r *Reader) tooLong() error {
	r.long = nil
	r.n++
	return &LineTooLongError{Line: r.n, Limit: r.limit}
}

// readError is a failed read of stdin. It keeps the cause as text only:
// stdin is not a file named on the command line, and a command tells the
// files it could not open or read by their *fs.PathError (exit status 2).
func readError(err error) error { return fmt.Errorf("read stdin: %v", err) }

// skipLine reads past the rest of a too long line, through its '\n' or to
// the end of the input.
func (r *Reader) skipLine() error {
	for {
		_, err := r.r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			r.done = true
		case err != nil:
			return readError(err)
		}
		r.skip = false
		return nil
	}
}

// Buffered reports whether input is at hand: the next call of Next may
// return without waiting for the input to have more.
func (r *Reader) Buffered() bool { return r.r.Buffered() > 0 }

// Writer prints records on a stage's output as the upstream stdio producer
// does ([Producer]), one whole line per write, safe for concurrent use.
type Writer struct {
	mu   sync.Mutex
	w    io.Writer
	prod Producer
	buf  []byte
	// done is why the output takes no more lines: [ErrClosed], or a
	// failed write ([ErrFailed]); nil while it does.
	done error
}

// NewWriter returns a Writer to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write prints record, already in its final form (enveloped when it has
// headers), under key. An empty record is [ErrEmpty]; once the output was
// found closed (EPIPE), every write is [ErrClosed]; once a write failed
// otherwise, every write is that failure, an [ErrFailed].
func (pw *Writer) Write(key string, record []byte) error {
	if len(record) == 0 {
		return ErrEmpty
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.done != nil {
		return pw.done
	}
	line, _, err := pw.prod.Append(pw.buf[:0], time.Now(), key, record)
	if err != nil {
		return err
	}
	pw.buf = line
	if _, err := pw.w.Write(line); err != nil {
		pw.done = fmt.Errorf("%w: %w", ErrFailed, err)
		if errors.Is(err, syscall.EPIPE) {
			pw.done = ErrClosed
		}
		return pw.done
	}
	return nil
}

// Err returns why the output takes no more lines ([ErrClosed], or an
// [ErrFailed]), nil while it does.
func (pw *Writer) Err() error {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return pw.done
}
