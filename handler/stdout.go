package handler

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/pipe"
)

// stdoutKeepBuffer is the largest line buffer the stdout handler keeps
// between records; a longer line's buffer is left to the garbage collector.
const stdoutKeepBuffer = 64 << 10

// stdoutHandler prints one line per record and acknowledges it. A write
// error is OutcomeFailed. Lines of concurrent deliveries never interleave.
//
// Format "log" (the default) is the line of streamd decode --format=log,
// [pipe.AppendLogLine]:
//
//	[2023-11-14T22:13:20.5 | orders | 7 | 0] payload
//
// Format "ndjson" is one JSON object per record. The fields shared with
// streamd decode --format=ndjson have its names and encodings; it adds the
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
	ndjson bool

	mu  sync.Mutex
	buf []byte
}

func newStdoutHandler(cfg conf.Handler, w io.Writer) (*stdoutHandler, error) {
	if w == nil {
		return nil, errors.New("no output writer")
	}
	h := &stdoutHandler{w: w}
	switch f := cmp.Or(cfg.Format, "log"); f {
	case "log":
	case "ndjson":
		h.ndjson = true
	default:
		return nil, fmt.Errorf("format: unknown %q: use log or ndjson", f)
	}
	return h, nil
}

// Handle writes d's line.
func (h *stdoutHandler) Handle(_ context.Context, d *Delivery) Outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.buf[:0]
	if h.ndjson {
		b = appendDeliveryJSON(b, d)
	} else {
		b = pipe.AppendLogLine(b, time.UnixMilli(int64(d.TimestampMs)), d.Key, d.Seq, d.Shard, d.Payload)
	}
	_, err := h.w.Write(b)
	if cap(b) <= stdoutKeepBuffer {
		h.buf = b
	} else {
		h.buf = nil
	}
	if err != nil {
		return failedOutcome(fmt.Errorf("stdout: %w", err))
	}
	return Outcome{Kind: OutcomeAck}
}

// appendDeliveryJSON appends d's ndjson line, as the stdoutHandler
// documentation describes it.
func appendDeliveryJSON(b []byte, d *Delivery) []byte {
	b = append(b, `{"subscription":`...)
	b = AppendJSONString(b, d.Subscription)
	b = append(b, `,"stream_key":`...)
	b = AppendJSONString(b, d.Key)
	b = append(b, `,"shard_id":`...)
	b = strconv.AppendUint(b, d.Shard, 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, d.Seq, 10)
	b = append(b, `,"timestamp_ms":`...)
	b = strconv.AppendUint(b, d.TimestampMs, 10)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendUint(b, d.Attempt, 10)
	b = append(b, `,"headers":{`...)
	binary := 0
	first := true
	for _, e := range d.Headers {
		if !utf8.Valid(e.Value) {
			binary++
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = AppendJSONString(b, e.Name)
		b = append(b, ':')
		b = AppendJSONString(b, string(e.Value))
	}
	b = append(b, '}')
	if binary > 0 {
		b = append(b, `,"headers_b64":{`...)
		first = true
		for _, e := range d.Headers {
			if utf8.Valid(e.Value) {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = AppendJSONString(b, e.Name)
			b = append(b, `:"`...)
			b = base64.StdEncoding.AppendEncode(b, e.Value)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, `,"payload_b64":"`...)
	b = base64.StdEncoding.AppendEncode(b, d.Payload)
	return append(b, "\"}\n"...)
}

// AppendJSONString appends s as a JSON string, without the HTML escaping
// of encoding/json's defaults: the strings of the ndjson that the stdout
// handler and streamd decode print.
func AppendJSONString(b []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		c := s[i]
		plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\'
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
}

// discardHandler acknowledges every record at once and does nothing else.
type discardHandler struct{}

// Handle returns ack.
func (discardHandler) Handle(context.Context, *Delivery) Outcome {
	return Outcome{Kind: OutcomeAck}
}
