package streamfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/pipe"
)

// Batches of [PublishLines] end at whichever limit comes first.
const (
	lineBatchFrames = 1024
	lineBatchBytes  = 1 << 20
)

// LineOptions say how [PublishLines] makes records of lines.
type LineOptions struct {
	// Key is the stream key of a line without a bracketed key; when it is
	// empty, such a line is a [*NoKeyError].
	Key string
	// Headers go into the envelope of every record's payload.
	Headers envelope.Headers
}

// PublishLines reads r to its end, one record per line in the SeaStreamer
// stdio format ([pipe.ParseLine]), and hands the records to publish in
// batches of up to 1024 frames or 1 MiB of payload, and whenever r has no
// more input at hand, so that records go out as they come. A line's
// bracketed key and shard win over o.Key; its payload goes into an
// envelope with o.Headers; its timestamp is the current time. The frames
// are valid during the call of publish only. The first line that cannot be
// read or parsed, or the first error of publish, stops it: the lines
// before it in its batch are not handed out. It returns the number of
// records publish took, counting those of a failed batch that an
// [*AppendError] of publish counts as written: they are the records of the
// first lines of r, so that publishing r from the line after them neither
// loses nor repeats one.
func PublishLines(r io.Reader, o LineOptions, publish func([]Frame) error) (published int, err error) {
	lines := pipe.NewReader(r)
	var (
		batch []Frame
		size  int
		arena []byte // the batch's payloads: a line is valid until the next
	)
	for lineNo := 1; ; lineNo++ {
		line, rerr := lines.Next()
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return published, rerr
		}
		if rerr == nil {
			f, err := lineFrame(line, lineNo, &o, &arena)
			if err != nil {
				return published, err
			}
			batch = append(batch, f)
			size += len(f.Payload)
		}
		if len(batch) > 0 && (rerr != nil || !lines.Buffered() || len(batch) >= lineBatchFrames || size >= lineBatchBytes) {
			if err := publish(batch); err != nil {
				if ae, ok := errors.AsType[*AppendError](err); ok {
					published += ae.Frames
				}
				return published, err
			}
			published += len(batch)
			batch, size = batch[:0], 0
			arena = nil // the next batch must not write over the payloads handed out
		}
		if rerr != nil {
			return published, nil
		}
	}
}

// NoKeyError is a line without a bracketed key, met when
// [LineOptions.Key] is empty.
type NoKeyError struct{ Line int }

func (e *NoKeyError) Error() string { return fmt.Sprintf("stdin line %d has no [key]", e.Line) }

// lineFrame makes the frame of line number n, its payload appended to arena.
func lineFrame(line []byte, n int, o *LineOptions, arena *[]byte) (Frame, error) {
	l, err := pipe.ParseLine(line)
	if err != nil {
		return Frame{}, fmt.Errorf("stdin line %d: %w", n, err)
	}
	key := o.Key
	if l.HasStreamKey {
		key = string(l.StreamKey)
	}
	if key == "" {
		return Frame{}, &NoKeyError{Line: n}
	}
	if err := ReservedKey(key); err != nil {
		return Frame{}, fmt.Errorf("stdin line %d: %w", n, err)
	}
	start := len(*arena)
	*arena = envelope.AppendEncode(*arena, o.Headers, l.Payload, false)
	return Frame{
		Key:         key,
		Shard:       l.ShardID,
		TimestampMs: uint64(time.Now().UnixMilli()),
		Payload:     (*arena)[start:len(*arena):len(*arena)],
	}, nil
}

// PublishFile appends the lines of r to the stream file at path as
// [PublishLines] makes records of them, through an [Appender] opened with
// ao at the first batch, so that input that fails at once writes nothing;
// input without a line creates a missing file with ao.Create.
// What it appended is synced before it returns, even after an error. It
// returns the number of records appended, the first lines of r, as
// PublishLines counts them.
func PublishFile(path string, r io.Reader, lo LineOptions, ao AppendOptions) (int, error) {
	var a *Appender
	n, err := PublishLines(r, lo, func(batch []Frame) error {
		if a == nil {
			var err error
			if a, err = OpenAppender(path, ao); err != nil {
				return err
			}
		}
		return a.Publish(batch)
	})
	if a == nil && err == nil && ao.Create {
		// No line: a missing file is created all the same, its header
		// alone, for readers to follow; one that exists is left as it is.
		if _, serr := os.Stat(path); errors.Is(serr, fs.ErrNotExist) {
			a, err = OpenAppender(path, ao)
		}
	}
	if a != nil {
		err = errors.Join(err, a.Sync(), a.Close())
	}
	return n, err
}
