package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// decodeCommand is `streamd decode`: print the records of a stream file.
func decodeCommand(app *kingpin.Application) action {
	cmd := app.Command("decode", "Print the records of a stream file, up to its size when the command starts.")
	format := cmd.Flag("format", "Output format: log (stdio lines) or ndjson.").Default("log").Enum("log", "ndjson")
	headers := cmd.Flag("headers", `Decode each record's header envelope (rs1:, rs2:): show its headers (ndjson: a "headers" object; log: a "#   name: value" line each) and the payload inside it.`).Bool()
	follow := cmd.Flag("follow", "Print the messages as the file grows, until its end-of-stream frame or SIGINT/SIGTERM; beacons are not printed.").Bool()
	path := cmd.Arg("FILE", "The stream file.").Required().String()
	return func(s stdio) int {
		p, err := streamfile.ParseFormat(*format)
		if err != nil {
			panic(err) // the flag's enum admits only the formats
		}
		if *headers {
			p = p.WithHeaders()
		}
		if *follow {
			ctx, stop := stopContext()
			defer stop()
			logger := slog.New(slog.NewTextHandler(s.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
			return decodeExit(s.err, tail.Print(ctx, s.out, *path, p, logger))
		}
		pos, size, err := p.PrintFile(s.out, *path)
		if _, bad := errors.AsType[*streamfile.HeaderError](err); !bad && errors.Is(err, streamfile.ErrTruncated) {
			fmt.Fprintf(s.err, "streamd decode: %s: file ends inside the frame at offset %d (size %d): it may have been truncated or still be written\n", *path, pos, size)
			return exitOK
		}
		return decodeExit(s.err, err)
	}
}

// decodeExit says on errw why a decode stopped, unless it ended cleanly or
// its reader went away (EPIPE), and returns its exit code: 2 for a file
// that cannot be opened or read, 1 for data that is not a stream file's or
// is damaged, and for a failed write.
func decodeExit(errw io.Writer, err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, syscall.EPIPE):
		return exitError
	}
	fmt.Fprintf(errw, "streamd decode: %v\n", err)
	if _, unwritable := errors.AsType[*streamfile.WriteError](err); unwritable {
		return exitError
	}
	return failureExit(err)
}
