package handler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/streamfile"
)

// stdoutKeepBuffer is the largest line buffer the stdout handler keeps
// between records; a longer line's buffer is left to the garbage collector.
const stdoutKeepBuffer = 64 << 10

// stdoutHandler prints one line per record and acknowledges it. A write
// error is OutcomeFailed. Lines of concurrent deliveries never interleave.
//
// Format "log" (the default) is the line of streamd decode --format=log,
// [streamfile.FormatLog]:
//
//	[2023-11-14T22:13:20.5 | orders | 7 | 0] payload
//
// Format "ndjson" is one JSON object per record, [streamfile.FormatNDJSON]
// with [streamfile.FrameContext.Delivered]. The fields shared with streamd
// decode --format=ndjson have its names and encodings; it adds the
// subscription, the attempt and the headers, and has no offset or checksum:
//
//	{"subscription":"billing","stream_key":"orders","shard_id":0,"seq":7,
//	 "timestamp_ms":1700000000500,"attempt":1,
//	 "headers":{"content-type":"text/plain","stream-sequence":"7"},
//	 "headers_b64":{"blob":"AP8="},"payload_b64":"aGVsbG8="}
//
// (one line in the output). Numbers are exact decimal integers (read them as
// uint64). "headers" maps each header whose value is valid UTF-8 to that
// value, in the record's order; "headers_b64" maps each other header to its
// value in standard base64 with padding, and is left out when there is none.
// A name is in exactly one of the two. "payload_b64" is the payload without
// its envelope, in standard base64 with padding ("" when empty).
type stdoutHandler struct {
	w      io.Writer
	format streamfile.Format

	mu  sync.Mutex
	buf []byte
}

func newStdoutHandler(cfg conf.Handler, w io.Writer) (*stdoutHandler, error) {
	if w == nil {
		return nil, errors.New("no output writer")
	}
	var f streamfile.Format
	if err := f.UnmarshalText([]byte(cmp.Or(cfg.Format, "log"))); err != nil {
		return nil, err
	}
	return &stdoutHandler{w: w, format: f}, nil
}

// Handle writes d's line.
func (h *stdoutHandler) Handle(_ context.Context, d *Delivery) Outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.format.AppendFrame(h.buf[:0], d.frame(),
		&streamfile.FrameContext{Delivered: true, Subscription: d.Subscription, Attempt: d.Attempt, Headers: d.Headers})
	_, err := h.w.Write(b)
	if cap(b) <= stdoutKeepBuffer {
		h.buf = b
	} else {
		h.buf = nil
	}
	if err != nil {
		return Failed(FailureOther, fmt.Errorf("stdout: %w", err))
	}
	return Outcome{Kind: OutcomeAck}
}

// discardHandler acknowledges every record at once and does nothing else.
type discardHandler struct{}

// Handle returns ack.
func (discardHandler) Handle(context.Context, *Delivery) Outcome {
	return Outcome{Kind: OutcomeAck}
}

// Blind reports true: discard reads nothing of a delivery.
func (discardHandler) Blind() bool { return true }
