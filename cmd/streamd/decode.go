package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

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
	p, err := streamfile.ParseFormat(*format)
	if err != nil {
		fmt.Fprintf(s.err, "streamd decode: unknown --format %q: use log or ndjson\n", *format)
		return exitUsage
	}
	out := bufio.NewWriterSize(s.out, 64<<10)
	if *follow {
		return followFile(fs.Arg(0), p, out, s.err)
	}
	return decodeFile(fs.Arg(0), p, out, s.err)
}

// flushed flushes out and reports whether that worked; a reader that went
// away (EPIPE) is not worth a message.
func flushed(out *bufio.Writer, errw io.Writer) bool {
	err := out.Flush()
	if err != nil && !errors.Is(err, syscall.EPIPE) {
		fmt.Fprintf(errw, "streamd decode: write output: %v\n", err)
	}
	return err == nil
}

// decodeFile prints the file at path as it is when the decode starts
// ([streamfile.Format.Print]).
func decodeFile(path string, p streamfile.Format, out *bufio.Writer, errw io.Writer) int {
	f, err := os.Open(path)
	var fi os.FileInfo
	if err == nil {
		defer f.Close()
		fi, err = f.Stat()
	}
	if err != nil {
		fmt.Fprintf(errw, "streamd decode: %v\n", err)
		return exitUsage
	}
	h, err := streamfile.ReadHeader(f)
	if errors.Is(err, streamfile.ErrTruncated) {
		err = errors.New("shorter than the 128-byte header")
	}
	if err != nil {
		fmt.Fprintf(errw, "streamd decode: %s: %v\n", path, err)
		return exitError
	}
	pos, err := p.Print(out, io.NewSectionReader(f, 0, fi.Size()), &h, fi.Size())
	var ce *streamfile.ChecksumError
	var fe *streamfile.FormatError
	switch {
	case !flushed(out, errw): // a failed write ends the decode too
		return exitError
	case err == nil:
		return exitOK
	case errors.Is(err, streamfile.ErrTruncated):
		fmt.Fprintf(errw, "streamd decode: %s: file ends inside the frame at offset %d (size %d): it may have been truncated or still be written\n", path, pos, fi.Size())
		return exitOK
	}
	fmt.Fprintf(errw, "streamd decode: %s: %v\n", path, err)
	if errors.As(err, &ce) || errors.As(err, &fe) {
		return exitError
	}
	return exitUsage
}

// followFile prints the messages of the file at path as a [tail.Follower]
// delivers them, until the end of stream or a signal. A file's header line
// comes before its messages, again after the path was replaced. Corrupt
// data stops it, with an error line as decodeFile prints it.
func followFile(path string, p streamfile.Format, out *bufio.Writer, errw io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fl, err := tail.New(tail.Options{Path: path, OnCorrupt: tail.StopOnCorrupt, Logger: logger})
	if err != nil {
		fmt.Fprintf(errw, "streamd decode: %v\n", err)
		if errors.Is(err, fs.ErrNotExist) {
			return exitUsage
		}
		return exitError
	}
	defer fl.Close()
	file := fl.Position().File
	var line []byte
	if h := fl.Header(); h.BeaconInterval != 0 {
		line = p.AppendHeader(line, &h)
	}
	for {
		out.Write(line)
		if !flushed(out, errw) {
			return exitError
		}
		line = line[:0]
		r, err := fl.Next(ctx)
		if err == nil {
			if r.File != file {
				h := fl.Header()
				line, file = p.AppendHeader(line, &h), r.File
			}
			line = p.AppendRecord(line, r.Record)
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
			return exitOK
		}
		out.Write(p.AppendError(line, err, 0, 0)) // a follower waits at a torn tail: err is damage or a failure
		fmt.Fprintf(errw, "streamd decode: %v\n", err)
		flushed(out, errw)
		return exitError
	}
}
