package streamfile

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/pipe"
)

// Format is a text format for what a stream file holds, one line per item:
// the output of streamd decode and the lines of the stdout handler. Each
// Append method appends one line, with its newline.
type Format uint8

const (
	// FormatLog prints a message as a SeaStreamer stdio line in its 4-part
	// form ([pipe.AppendLogLine]), and the header, beacons and a terminal
	// error as lines that start with "# ", as the upstream decoder does.
	FormatLog Format = iota
	// FormatNDJSON prints one JSON object per line, in the schema of
	// testdata/streamfile/README.md. Numbers are exact decimal integers,
	// payloads standard base64 with padding.
	FormatNDJSON
)

// withHeaders is the bit of a [Format] that [Format.WithHeaders] sets.
const withHeaders Format = 1 << 7

// WithHeaders returns p that also decodes the header envelope (rs1:, rs2:)
// of each message of a file: [Format.AppendRecord] then prints the headers
// ([FrameContext.ShowHeaders]) and the payload inside the envelope, in
// place of the envelope's text. A message without an envelope prints with
// no headers and its payload as it is.
func (p Format) WithHeaders() Format { return p | withHeaders }

// text returns the text format of p, without the WithHeaders bit.
func (p Format) text() Format { return p &^ withHeaders }

// formatNames are the names of the text formats, as flags and
// configuration files give them.
var formatNames = [...]string{FormatLog: "log", FormatNDJSON: "ndjson"}

// MarshalText returns the name of p's text format: "log" or "ndjson".
func (p Format) MarshalText() ([]byte, error) { return []byte(formatNames[p.text()]), nil }

// UnmarshalText sets p to the format text names, "log" or "ndjson".
func (p *Format) UnmarshalText(text []byte) error {
	i := slices.Index(formatNames[:], string(text))
	if i < 0 {
		return fmt.Errorf("unknown format %q: use log or ndjson", text)
	}
	*p = Format(i)
	return nil
}

// FrameContext is what a message line says of its frame beyond the
// frame's own fields. [FormatLog] prints only the headers (ShowHeaders);
// [FormatNDJSON] prints all of it.
type FrameContext struct {
	// InFile adds where the frame is in its file, as streamd decode prints
	// it: "offset" (the frame's first byte) first, and "checksum" (the
	// stored CRC) last.
	InFile   bool
	Offset   int64
	Checksum uint16

	// Delivered adds what a handler knows of the delivery, as the stdout
	// handler prints it (with the payload out of its envelope):
	// "subscription" first, then "attempt", "headers" and "headers_b64"
	// before "payload_b64". "headers" maps each header whose value is
	// valid UTF-8 to that value, in the record's order; "headers_b64" maps
	// each other header to its value in base64, and is left out when there
	// is none.
	Delivered    bool
	Subscription string
	Attempt      uint64
	Headers      envelope.Headers

	// ShowHeaders adds the Headers without the rest of Delivered, as
	// streamd decode --headers prints them: in ndjson "headers" and
	// "headers_b64" as above, before "payload_b64"; in the log format one
	// line "#   name: value" per header after the message line, the value
	// quoted as a Go string when it is not printable UTF-8.
	ShowHeaders bool
}

// AppendFrame appends the line of the message f, with what c adds (nil:
// nothing). The ndjson fields of the frame are "stream_key", "shard_id",
// "seq", "timestamp_ms" and "payload_b64", in this order.
func (p Format) AppendFrame(b []byte, f *Frame, c *FrameContext) []byte {
	if c == nil {
		c = &FrameContext{}
	}
	if p.text() == FormatLog {
		b = pipe.AppendLogLine(b, time.UnixMilli(int64(f.TimestampMs)), f.Key, f.Seq, f.Shard, f.Payload)
		if c.ShowHeaders {
			b = appendHeaderLines(b, c.Headers)
		}
		return b
	}
	b = append(b, '{')
	if c.InFile {
		b = append(b, `"offset":`...)
		b = strconv.AppendInt(b, c.Offset, 10)
		b = append(b, ',')
	}
	if c.Delivered {
		b = append(b, `"subscription":`...)
		b = appendJSONString(b, c.Subscription)
		b = append(b, ',')
	}
	b = appendMetaJSON(b, f.Key, f.Shard, f.Seq, f.TimestampMs)
	if c.Delivered {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendUint(b, c.Attempt, 10)
	}
	if c.Delivered || c.ShowHeaders {
		b = appendHeadersJSON(b, c.Headers)
	}
	b = append(b, `,"payload_b64":"`...)
	b = base64.StdEncoding.AppendEncode(b, f.Payload)
	b = append(b, '"')
	if c.InFile {
		b = append(b, `,"checksum":`...)
		b = strconv.AppendUint(b, uint64(c.Checksum), 10)
	}
	return append(b, "}\n"...)
}

// appendMetaJSON appends the members of a message's meta (SeaStreamer's
// message header), which a message line and each marker of a beacon line
// share: "stream_key", "shard_id", "seq" and "timestamp_ms".
func appendMetaJSON(b []byte, key string, shard, seq, timestampMs uint64) []byte {
	b = append(b, `"stream_key":`...)
	b = appendJSONString(b, key)
	b = append(b, `,"shard_id":`...)
	b = strconv.AppendUint(b, shard, 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"timestamp_ms":`...)
	return strconv.AppendUint(b, timestampMs, 10)
}

// appendHeadersJSON appends the "headers" and "headers_b64" members of h,
// as [FrameContext] describes them.
func appendHeadersJSON(b []byte, h envelope.Headers) []byte {
	b = append(b, `,"headers":{`...)
	binary := 0
	first := true
	for _, e := range h {
		if !utf8.Valid(e.Value) {
			binary++
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, e.Name)
		b = append(b, ':')
		b = appendJSONString(b, string(e.Value))
	}
	b = append(b, '}')
	if binary == 0 {
		return b
	}
	b = append(b, `,"headers_b64":{`...)
	first = true
	for _, e := range h {
		if utf8.Valid(e.Value) {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, e.Name)
		b = append(b, `:"`...)
		b = base64.StdEncoding.AppendEncode(b, e.Value)
		b = append(b, '"')
	}
	return append(b, '}')
}

// appendHeaderLines appends the log format's line of each header of h, as
// [FrameContext.ShowHeaders] describes them.
func appendHeaderLines(b []byte, h envelope.Headers) []byte {
	for _, e := range h {
		b = append(b, "#   "...)
		b = append(b, e.Name...)
		b = append(b, ": "...)
		if printable(e.Value) {
			b = append(b, e.Value...)
		} else {
			b = strconv.AppendQuote(b, string(e.Value))
		}
		b = append(b, '\n')
	}
	return b
}

// printable reports whether v is valid UTF-8 of printable characters and
// spaces only, so that it reads as it is on one line.
func printable(v []byte) bool {
	for _, r := range string(v) {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

// AppendRecord appends the line of r, a message read from a file, as
// streamd decode prints it; with [Format.WithHeaders], its envelope
// decoded.
func (p Format) AppendRecord(b []byte, r *Record) []byte {
	c := &FrameContext{InFile: true, Offset: r.Offset, Checksum: r.Checksum}
	f := &r.Frame
	if p&withHeaders != 0 {
		inner := r.Frame
		c.Headers, inner.Payload = envelope.Decode(r.Frame.Payload)
		c.ShowHeaders, f = true, &inner
	}
	return p.AppendFrame(b, f, c)
}

// AppendHeader appends the line of a file's header.
func (p Format) AppendHeader(b []byte, h *Header) []byte {
	if p.text() == FormatLog {
		return fmt.Appendf(b, "# header: file_name=%q created_at=%s beacon_interval=%d\n",
			h.FileName, time.UnixMilli(int64(h.CreatedAtMs)).UTC().Format(time.RFC3339Nano), h.BeaconInterval)
	}
	b = append(b, `{"file_name":`...)
	b = appendJSONString(b, h.FileName)
	b = append(b, `,"created_at_ms":`...)
	b = strconv.AppendUint(b, h.CreatedAtMs, 10)
	b = append(b, `,"beacon_interval":`...)
	b = strconv.AppendUint(b, uint64(h.BeaconInterval), 10)
	return append(b, "}\n"...)
}

// AppendBeacon appends the line of the beacon bc at offset at.
func (p Format) AppendBeacon(b []byte, at int64, bc *Beacon) []byte {
	if p.text() == FormatLog {
		b = fmt.Appendf(b, "# beacon at %d: remaining=%d markers=%d", at, bc.Remaining, len(bc.Markers))
		for _, m := range bc.Markers {
			b = fmt.Appendf(b, " [%s | %d | %d | %d | %d]", m.Key, m.Seq, m.Shard, m.TimestampMs, m.RunningChecksum)
		}
		return append(b, '\n')
	}
	b = append(b, `{"beacon_at":`...)
	b = strconv.AppendInt(b, at, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendUint(b, uint64(bc.Remaining), 10)
	b = append(b, `,"items":[`...)
	for i, m := range bc.Markers {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		b = appendMetaJSON(b, m.Key, m.Shard, m.Seq, m.TimestampMs)
		b = append(b, `,"running_checksum":`...)
		b = strconv.AppendUint(b, uint64(m.RunningChecksum), 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

// AppendError appends the terminal line of a decode that err ended: a
// [*ChecksumError], a [*FormatError], or [ErrTruncated] for a frame at pos
// that the end of the file, at size, cuts. Any other error appends nothing.
func (p Format) AppendError(b []byte, err error, pos, size int64) []byte {
	var ce *ChecksumError
	var fe *FormatError
	switch {
	case errors.As(err, &ce) && p.text() == FormatLog:
		return fmt.Appendf(b, "# error: checksum mismatch in the frame at offset %d: stored %d, computed %d\n", ce.Offset, ce.Received, ce.Computed)
	case errors.As(err, &ce):
		return fmt.Appendf(b, `{"error":"checksum","offset":%d,"received":%d,"computed":%d}`+"\n", ce.Offset, ce.Received, ce.Computed)
	case errors.As(err, &fe) && p.text() == FormatLog:
		return fmt.Appendf(b, "# error: format error at offset %d: %s\n", fe.Offset, fe.Reason)
	case errors.As(err, &fe):
		b = fmt.Appendf(b, `{"error":"format","offset":%d,"reason":`, fe.Offset)
		return append(appendJSONString(b, fe.Reason), "}\n"...)
	case errors.Is(err, ErrTruncated) && p.text() == FormatLog:
		return fmt.Appendf(b, "# error: truncated: the frame at offset %d is incomplete (file size %d)\n", pos, size)
	case errors.Is(err, ErrTruncated):
		return fmt.Appendf(b, `{"error":"truncated","offset":%d,"file_size":%d}`+"\n", pos, size)
	}
	return b
}

// Print prints the file r of size bytes, whose header is h, to w as a
// sequential reader sees it: the header, then the messages and the beacons
// passed on the way in file order (a beacon inside a frame comes after
// it), and a terminal error line when damage or the end of the data inside
// a frame stops the decode. It returns the error that stopped it, nil at
// the end of the data or of the stream: [ErrTruncated], a [*ChecksumError]
// or a [*FormatError] (after their error line; a frame that runs past the
// end with whole frames after it is one, see [DamagedSize]), a read error,
// or the first
// error writing to w as a [*WriteError]; and the position of the decoder
// then, the start of the frame a truncation or a format error is about.
func (p Format) Print(w io.Writer, r io.ReaderAt, h *Header, size int64) (pos int64, err error) {
	if _, err := w.Write(p.AppendHeader(nil, h)); err != nil {
		return HeaderSize, &WriteError{err}
	}
	// Beacons are reported as the decoder passes them, which is before the
	// frame they interrupt is complete: they wait for the frames before
	// them to be printed.
	type beaconLine struct {
		at   int64
		line []byte
	}
	var pending []beaconLine
	d := NewDecoder(r, *h, HeaderSize)
	d.OnBeacon(func(at int64, bc *Beacon) {
		pending = append(pending, beaconLine{at, p.AppendBeacon(nil, at, bc)})
	})
	var line []byte
	// write writes the pending beacons before offset before, and then line.
	write := func(before int64) error {
		for len(pending) > 0 && pending[0].at < before {
			if _, err := w.Write(pending[0].line); err != nil {
				return &WriteError{err}
			}
			pending = pending[1:]
		}
		if _, err := w.Write(line); err != nil {
			return &WriteError{err}
		}
		return nil
	}
	for {
		rec, err := d.Next()
		if err == nil {
			line = p.AppendRecord(line[:0], rec)
			if err := write(rec.Offset); err != nil {
				return d.Pos(), err
			}
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, ErrEndOfStream) {
			err = nil
		}
		if errors.Is(err, ErrTruncated) {
			if _, derr := DamagedSize(r, int64(h.BeaconInterval), d.Pos(), size); derr != nil {
				if _, damaged := errors.AsType[*FormatError](derr); !damaged {
					return d.Pos(), derr // a read error
				}
				err = derr
			}
		}
		line = p.AppendError(line[:0], err, d.Pos(), size)
		if werr := write(size + 1); werr != nil {
			return d.Pos(), werr
		}
		return d.Pos(), err
	}
}

// HeaderError is a file whose first 128 bytes are not a stream file's
// header: too short, another format, another version.
type HeaderError struct {
	Path string
	Err  error
}

func (e *HeaderError) Error() string {
	if errors.Is(e.Err, ErrTruncated) {
		return e.Path + ": shorter than the 128-byte header"
	}
	if _, named := errors.AsType[*fs.PathError](e.Err); named {
		return e.Err.Error() // it names the path already
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *HeaderError) Unwrap() error { return e.Err }

// WriteError is a failure to write what [Format.Print] prints.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "write output: " + e.Err.Error() }

func (e *WriteError) Unwrap() error { return e.Err }

// PrintFile prints the stream file at path with [Format.Print] to w,
// buffered, up to the size it has when PrintFile starts. It returns that
// size, and the position and the error where Print stopped, the error
// wrapped with the path; a file that cannot be opened, or a directory, is
// an [*fs.PathError], one that is not a regular file (a FIFO, a device) a
// [*NotRegularError] ([OpenRegular]), and one whose header is not a stream
// file's a [*HeaderError].
func (p Format) PrintFile(w io.Writer, path string) (pos, size int64, err error) {
	f, err := OpenRegular(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	h, err := ReadHeader(f)
	if err != nil {
		return 0, fi.Size(), &HeaderError{Path: path, Err: err}
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	pos, err = p.Print(bw, io.NewSectionReader(f, 0, fi.Size()), &h, fi.Size())
	if ferr := bw.Flush(); ferr != nil && err == nil {
		err = &WriteError{ferr}
	}
	if _, named := errors.AsType[*fs.PathError](err); err != nil && !named {
		err = fmt.Errorf("%s: %w", path, err) // a *fs.PathError names the path already
	}
	return pos, fi.Size(), err
}

// appendJSONString appends s as a JSON string, without the HTML escaping
// of encoding/json's defaults.
func appendJSONString(b []byte, s string) []byte {
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
