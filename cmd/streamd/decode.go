package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/pipe"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

func runDecode(args []string, s stdio) int {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(s.err)
	format := fs.String("format", "log", "output format: log (stdio lines) or ndjson")
	follow := fs.Bool("follow", false, "print the messages as the file grows, until its end-of-stream frame or SIGINT/SIGTERM; beacons are not printed")
	fs.Usage = func() {
		fmt.Fprintln(s.err, "usage: streamd decode [--format=log|ndjson] [--follow] FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	var p printer
	switch *format {
	case "log":
		p = &logPrinter{}
	case "ndjson":
		p = &ndjsonPrinter{}
	default:
		fmt.Fprintf(s.err, "streamd decode: unknown --format %q: use log or ndjson\n", *format)
		return exitUsage
	}
	path := fs.Arg(0)
	if *follow {
		return followFile(path, p, s)
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(s.err, "streamd decode: %v\n", err)
		return exitUsage
	}
	defer f.Close()
	out := bufio.NewWriterSize(s.out, 64<<10)
	code := decodeFile(f, path, p, out, s.err)
	if err := out.Flush(); err != nil {
		if !errors.Is(err, syscall.EPIPE) {
			fmt.Fprintf(s.err, "streamd decode: write output: %v\n", err)
		}
		return exitError
	}
	return code
}

// decodeFile prints every record of f, as it is when the decode starts, in
// file order: messages, the beacons passed on the way (a beacon inside a
// frame comes after it), and a terminal error record.
func decodeFile(f *os.File, path string, p printer, out *bufio.Writer, errw io.Writer) int {
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		if errors.Is(err, streamfile.ErrTruncated) {
			err = errors.New("shorter than the 128-byte header")
		}
		fmt.Fprintf(errw, "streamd decode: %s: %v\n", path, err)
		return exitError
	}
	fi, err := f.Stat()
	if err != nil {
		fmt.Fprintf(errw, "streamd decode: %v\n", err)
		return exitUsage
	}
	size := fi.Size()
	p.header(out, &h)

	type pendingBeacon struct {
		at   int64
		line []byte
	}
	var pending []pendingBeacon
	// Read up to the size the file had at the start.
	d := streamfile.NewDecoder(io.NewSectionReader(f, 0, size), h, streamfile.HeaderSize)
	d.OnBeacon(func(at int64, b *streamfile.Beacon) {
		var buf []byte
		buf = p.appendBeacon(buf, at, b)
		pending = append(pending, pendingBeacon{at, buf})
	})
	flush := func(before int64) {
		i := 0
		for ; i < len(pending) && pending[i].at < before; i++ {
			out.Write(pending[i].line)
		}
		pending = pending[i:]
	}
	var line []byte
	for {
		r, err := d.Next()
		if err == nil {
			flush(r.Offset)
			line = p.appendRecord(line[:0], r)
			out.Write(line)
			continue
		}
		flush(size + 1)
		var ce *streamfile.ChecksumError
		var fe *streamfile.FormatError
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, streamfile.ErrEndOfStream):
			return exitOK
		case errors.Is(err, streamfile.ErrTruncated):
			out.Write(p.appendError(nil, errorRecord{kind: "truncated", offset: d.Pos(), fileSize: size}))
			fmt.Fprintf(errw, "streamd decode: %s: file ends inside the frame at offset %d (size %d): it may have been truncated or still be written\n", path, d.Pos(), size)
			return exitOK
		case errors.As(err, &ce):
			out.Write(p.appendError(nil, errorRecord{kind: "checksum", offset: ce.Offset, received: ce.Received, computed: ce.Computed}))
			fmt.Fprintf(errw, "streamd decode: %s: %v\n", path, err)
			return exitError
		case errors.As(err, &fe):
			out.Write(p.appendError(nil, errorRecord{kind: "format", offset: fe.Offset, reason: fe.Reason}))
			fmt.Fprintf(errw, "streamd decode: %s: %v\n", path, err)
			return exitError
		default:
			fmt.Fprintf(errw, "streamd decode: %s: %v\n", path, err)
			return exitUsage
		}
	}
}

// followFile prints the messages of the file at path as a [tail.Follower]
// delivers them, until the end of stream or a signal. A file's header line
// comes before its messages, again after the path was replaced. Corrupt
// data stops it, with an error record as decodeFile prints it.
func followFile(path string, p printer, s stdio) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(s.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fl, err := tail.New(tail.Options{Path: path, OnCorrupt: tail.StopOnCorrupt, Logger: logger})
	if err != nil {
		fmt.Fprintf(s.err, "streamd decode: %v\n", err)
		if errors.Is(err, fs.ErrNotExist) {
			return exitUsage
		}
		return exitError
	}
	defer fl.Close()
	out := bufio.NewWriterSize(s.out, 64<<10)
	flushed := func() bool {
		err := out.Flush()
		if err != nil && !errors.Is(err, syscall.EPIPE) {
			fmt.Fprintf(s.err, "streamd decode: write output: %v\n", err)
		}
		return err == nil
	}
	file := fl.Position().File
	if h := fl.Header(); h.BeaconInterval != 0 {
		p.header(out, &h)
	}
	var line []byte
	for {
		if !flushed() {
			return exitError
		}
		r, err := fl.Next(ctx)
		if err == nil {
			if r.File != file {
				h := fl.Header()
				p.header(out, &h)
				file = r.File
			}
			line = p.appendRecord(line[:0], r.Record)
			out.Write(line)
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
			return exitOK
		}
		var ce *streamfile.ChecksumError
		var fe *streamfile.FormatError
		switch {
		case errors.As(err, &ce):
			out.Write(p.appendError(nil, errorRecord{kind: "checksum", offset: ce.Offset, received: ce.Received, computed: ce.Computed}))
		case errors.As(err, &fe):
			out.Write(p.appendError(nil, errorRecord{kind: "format", offset: fe.Offset, reason: fe.Reason}))
		}
		fmt.Fprintf(s.err, "streamd decode: %v\n", err)
		flushed()
		return exitError
	}
}

// errorRecord is the terminal record of a decode that did not end cleanly.
type errorRecord struct {
	kind               string // truncated, checksum, format
	offset, fileSize   int64
	received, computed uint16
	reason             string
}

// printer formats decode output.
type printer interface {
	header(w *bufio.Writer, h *streamfile.Header)
	appendRecord(dst []byte, r *streamfile.Record) []byte
	appendBeacon(dst []byte, at int64, b *streamfile.Beacon) []byte
	appendError(dst []byte, e errorRecord) []byte
}

// ndjsonPrinter prints the schema of testdata/streamfile/README.md.
type ndjsonPrinter struct{}

func (ndjsonPrinter) header(w *bufio.Writer, h *streamfile.Header) {
	b := []byte(`{"file_name":`)
	b = daemon.AppendJSONString(b, h.FileName)
	b = append(b, `,"created_at_ms":`...)
	b = strconv.AppendUint(b, h.CreatedAtMs, 10)
	b = append(b, `,"beacon_interval":`...)
	b = strconv.AppendUint(b, uint64(h.BeaconInterval), 10)
	w.Write(append(b, "}\n"...))
}

func (ndjsonPrinter) appendRecord(b []byte, r *streamfile.Record) []byte {
	b = append(b, `{"offset":`...)
	b = strconv.AppendInt(b, r.Offset, 10)
	b = append(b, `,"stream_key":`...)
	b = daemon.AppendJSONString(b, r.Key)
	b = append(b, `,"shard_id":`...)
	b = strconv.AppendUint(b, r.Shard, 10)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"timestamp_ms":`...)
	b = strconv.AppendUint(b, r.TimestampMs, 10)
	b = append(b, `,"payload_b64":"`...)
	b = base64.StdEncoding.AppendEncode(b, r.Payload)
	b = append(b, `","checksum":`...)
	b = strconv.AppendUint(b, uint64(r.Checksum), 10)
	return append(b, "}\n"...)
}

func (ndjsonPrinter) appendBeacon(b []byte, at int64, bc *streamfile.Beacon) []byte {
	b = append(b, `{"beacon_at":`...)
	b = strconv.AppendInt(b, at, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendUint(b, uint64(bc.Remaining), 10)
	b = append(b, `,"items":[`...)
	for i, m := range bc.Markers {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"stream_key":`...)
		b = daemon.AppendJSONString(b, m.Key)
		b = append(b, `,"shard_id":`...)
		b = strconv.AppendUint(b, m.Shard, 10)
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, m.Seq, 10)
		b = append(b, `,"timestamp_ms":`...)
		b = strconv.AppendUint(b, m.TimestampMs, 10)
		b = append(b, `,"running_checksum":`...)
		b = strconv.AppendUint(b, uint64(m.RunningChecksum), 10)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

func (ndjsonPrinter) appendError(b []byte, e errorRecord) []byte {
	b = append(b, `{"error":"`...)
	b = append(b, e.kind...)
	b = append(b, `","offset":`...)
	b = strconv.AppendInt(b, e.offset, 10)
	switch e.kind {
	case "truncated":
		b = append(b, `,"file_size":`...)
		b = strconv.AppendInt(b, e.fileSize, 10)
	case "checksum":
		b = append(b, `,"received":`...)
		b = strconv.AppendUint(b, uint64(e.received), 10)
		b = append(b, `,"computed":`...)
		b = strconv.AppendUint(b, uint64(e.computed), 10)
	default:
		b = append(b, `,"reason":`...)
		b = daemon.AppendJSONString(b, e.reason)
	}
	return append(b, "}\n"...)
}

// logPrinter prints messages as stdio lines in the 4-part form, and the
// header and beacons as lines starting with "# ", like the upstream decoder.
type logPrinter struct{}

func (logPrinter) header(w *bufio.Writer, h *streamfile.Header) {
	fmt.Fprintf(w, "# header: file_name=%q created_at=%s beacon_interval=%d\n",
		h.FileName, time.UnixMilli(int64(h.CreatedAtMs)).UTC().Format(time.RFC3339Nano), h.BeaconInterval)
}

func (logPrinter) appendRecord(b []byte, r *streamfile.Record) []byte {
	return pipe.AppendLogLine(b, time.UnixMilli(int64(r.TimestampMs)), r.Key, r.Seq, r.Shard, r.Payload)
}

func (logPrinter) appendBeacon(b []byte, at int64, bc *streamfile.Beacon) []byte {
	b = fmt.Appendf(b, "# beacon at %d: remaining=%d markers=%d", at, bc.Remaining, len(bc.Markers))
	for _, m := range bc.Markers {
		b = fmt.Appendf(b, " [%s | %d | %d | %d | %d]", m.Key, m.Seq, m.Shard, m.TimestampMs, m.RunningChecksum)
	}
	return append(b, '\n')
}

func (logPrinter) appendError(b []byte, e errorRecord) []byte {
	switch e.kind {
	case "truncated":
		return fmt.Appendf(b, "# error: truncated: the frame at offset %d is incomplete (file size %d)\n", e.offset, e.fileSize)
	case "checksum":
		return fmt.Appendf(b, "# error: checksum mismatch in the frame at offset %d: stored %d, computed %d\n", e.offset, e.received, e.computed)
	}
	return fmt.Appendf(b, "# error: format error at offset %d: %s\n", e.offset, e.reason)
}
