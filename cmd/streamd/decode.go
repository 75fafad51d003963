package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// decodeCommand is `streamd decode`: print the records of a stream file.
func decodeCommand(app *kingpin.Application) action {
	cmd := app.Command("decode", "Print the records of a stream file, up to its size when the command starts.")
	format := cmd.Flag("format", "Output format: log (stdio lines) or ndjson.").Default("log").Enum("log", "ndjson")
	follow := cmd.Flag("follow", "Print the messages as the file grows, until its end-of-stream frame or SIGINT/SIGTERM; beacons are not printed.").Bool()
	path := cmd.Arg("FILE", "The stream file.").Required().String()
	return func(s stdio) int {
		p, err := streamfile.ParseFormat(*format)
		if err != nil {
			panic(err) // the flag's enum admits only the formats
		}
		out := bufio.NewWriterSize(s.out, 64<<10)
		if *follow {
			return followFile(*path, p, out, s.err)
		}
		return decodeFile(*path, p, out, s.err)
	}
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
// ([streamfile.Format.PrintFile]).
func decodeFile(path string, p streamfile.Format, out *bufio.Writer, errw io.Writer) int {
	pos, size, err := p.PrintFile(out, path)
	var he *streamfile.HeaderError
	var ce *streamfile.ChecksumError
	var fe *streamfile.FormatError
	switch {
	case !flushed(out, errw): // a failed write ends the decode too
		return exitError
	case err == nil:
		return exitOK
	case errors.As(err, &he):
	case errors.Is(err, streamfile.ErrTruncated):
		fmt.Fprintf(errw, "streamd decode: %s: file ends inside the frame at offset %d (size %d): it may have been truncated or still be written\n", path, pos, size)
		return exitOK
	}
	fmt.Fprintf(errw, "streamd decode: %v\n", err)
	if errors.As(err, &he) || errors.As(err, &ce) || errors.As(err, &fe) {
		return exitError
	}
	return exitUsage
}

// followFile prints the messages of the file at path as it grows
// ([tail.Print]), until the end of stream or a signal.
func followFile(path string, p streamfile.Format, out *bufio.Writer, errw io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := tail.Print(ctx, out, path, p, logger)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, syscall.EPIPE): // the reader went away: not worth a message
		return exitError
	}
	fmt.Fprintf(errw, "streamd decode: %v\n", err)
	if errors.Is(err, fs.ErrNotExist) {
		return exitUsage
	}
	return exitError
}
