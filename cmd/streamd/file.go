package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
	"golang.org/x/sys/unix"
)

// decodeCommand is `streamd decode`: print the records of a stream file.
func decodeCommand(app *kingpin.Application) action {
	cmd := app.Command("decode", "Print the records of a stream file, up to its size when the command starts.")
	var p streamfile.Format
	cmd.Flag("format", "Output format: log (stdio lines) or ndjson.").Default("log").SetText(&p)
	headers := cmd.Flag("headers", `Decode each record's header envelope (rs1:, rs2:): show its headers (ndjson: a "headers" object; log: a line each, "#", indented, then "name: value") and the payload inside it.`).Bool()
	follow := cmd.Flag("follow", "Print the messages as the file grows, until its end-of-stream frame, SIGINT/SIGTERM, or the reader of its output pipe going away; beacons are not printed.").Bool()
	path := cmd.Arg("FILE", "The stream file.").Required().String()
	return func(s stdio) int {
		if *path == "" || *path == "-" {
			return s.exitWith(exitUsage, "streamd decode: give the path of a stream file: decode seeks in it, so it cannot read stdin")
		}
		if *headers {
			p = p.WithHeaders()
		}
		if *follow {
			ctx, _, stop := stopContext()
			defer stop()
			ctx, readerGone := context.WithCancel(ctx)
			defer readerGone()
			whenReaderGone(s.out, readerGone)
			logger := slog.New(slog.NewTextHandler(s.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
			return decodeExit(s.err, tail.Print(ctx, s.out, *path, p, logger))
		}
		pos, size, err := p.PrintFile(s.out, *path)
		if _, bad := errors.AsType[*streamfile.HeaderError](err); !bad && errors.Is(err, streamfile.ErrTruncated) {
			return s.exitWith(exitOK, "streamd decode: %s: file ends inside the frame at offset %d (size %d): it may have been truncated or still be written", *path, pos, size)
		}
		if off, ok := crashLeftovers(*path, size, err); ok {
			return s.exitWith(exitOK, "streamd decode: %s: the bytes from offset %d to the end (size %d) are what a crash leaves after the last frame (zeros, perhaps after the first bytes of a torn frame), which the next writer removes", *path, off, size)
		}
		return decodeExit(s.err, err)
	}
}

// whenReaderGone calls gone once the reader of out goes away, when out is a
// pipe: as tail -f does, decode --follow on a quiet file then ends (as in
// "| head -1"), rather than at the next write, which may never come. The
// kernel reports a pipe's write end whose readers all closed as an error
// condition, which poll waits for; the goroutine that waits lives as long
// as the command.
func whenReaderGone(out io.Writer, gone func()) {
	f, ok := out.(*os.File)
	if !ok {
		return
	}
	if fi, err := f.Stat(); err != nil || fi.Mode().Type() != fs.ModeNamedPipe {
		return
	}
	// Not f.Fd(), which would make the descriptor blocking, for the
	// process that shares it too.
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	var fd int32
	if rc.Control(func(d uintptr) { fd = int32(d) }) != nil {
		return
	}
	go func() {
		fds := []unix.PollFd{{Fd: fd}} // no events asked: POLLERR and POLLHUP come anyway
		for {
			n, err := unix.Poll(fds, -1)
			if err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				gone()
				return
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
}

// crashLeftovers reports whether the damage that stopped a decode of the
// file at path, of the given size, with err is what a crash leaves after
// the last frame (streamfile.CrashLeftovers): not damage, as writers and
// readers take it, and where.
func crashLeftovers(path string, size int64, err error) (int64, bool) {
	off := int64(-1)
	if ce, ok := errors.AsType[*streamfile.ChecksumError](err); ok {
		off = ce.Offset
	} else if fe, ok := errors.AsType[*streamfile.FormatError](err); ok {
		off = fe.Offset
	}
	if off < 0 {
		return 0, false
	}
	f, err := streamfile.OpenRegular(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		return 0, false
	}
	ok, err := streamfile.CrashLeftovers(f, int64(h.BeaconInterval), off, size)
	return off, err == nil && ok
}

// decodeExit says on errw why a decode stopped, unless it ended cleanly or
// its reader went away (EPIPE), and returns its exit code: 0 for those two
// (streamd decode FILE | head -1 succeeds, in a shell with pipefail too),
// 2 for a file that cannot be opened or read, 1 for data that is not a
// stream file's or is damaged, and for a failed write.
func decodeExit(errw io.Writer, err error) int {
	if err == nil || errors.Is(err, syscall.EPIPE) {
		return exitOK
	}
	fmt.Fprintf(errw, "streamd decode: %v\n", err)
	return failureExit(err)
}

// publishCommand is `streamd publish`: append stdio-format lines from
// stdin to a stream file.
func publishCommand(app *kingpin.Application) action {
	cmd := app.Command("publish", "Append one record per stdin line (SeaStreamer stdio format) to a stream file, created when missing. "+
		"A line's bracketed key (and shard) wins over --key; its sequence number and timestamp are not kept: sequences continue each key and shard's last one, timestamps are the current time.")
	path := cmd.Flag("file", "Stream file to append to (created when missing).").Required().String()
	key := cmd.Flag("key", "Stream key for lines without a bracketed key.").String()
	interval := cmd.Flag("beacon-interval", "Beacon interval in bytes when the file is created: a positive multiple of 1024.").
		Default(strconv.Itoa(streamfile.DefaultBeaconInterval)).Uint()
	headerTexts := cmd.Flag("header", "Header for every record (repeatable).").PlaceHolder("name=value").Strings()
	var mode conf.FileMode
	cmd.Flag("file-mode", "Permission bits of the file when publish creates it, in octal, whatever the umask: "+
		"0660 in a directory shared with streamd, which appends retry copies to it. Default: 0644 less the umask.").
		PlaceHolder("MODE").SetValue(&mode)
	return func(s stdio) int {
		if *path == "" {
			return s.exitWith(exitUsage, "streamd publish: --file is empty: name the stream file to append to")
		}
		if err := streamfile.CheckBeaconInterval(int64(*interval)); err != nil {
			return s.exitWith(exitUsage, "streamd publish: %v", err)
		}
		var headers envelope.Headers
		for _, text := range *headerTexts {
			name, value, err := envelope.ParseHeader(text)
			if err != nil {
				return s.exitWith(exitUsage, "streamd publish: --header: %v", err)
			}
			headers.Set(name, value)
		}
		if *key != "" {
			if err := errors.Join(streamfile.ValidKey(*key), streamfile.ReservedKey(*key)); err != nil {
				return s.exitWith(exitUsage, "streamd publish: --key: %v", err)
			}
		}
		n, err := streamfile.PublishFile(*path, s.in, streamfile.LineOptions{Key: *key, Headers: headers},
			streamfile.AppendOptions{Create: true, BeaconInterval: uint32(*interval), Mode: fs.FileMode(mode), Log: slog.New(slog.NewTextHandler(s.err, nil))})
		if _, noKey := errors.AsType[*streamfile.NoKeyError](err); noKey {
			err = fmt.Errorf("%w and --key is not set", err)
		}
		if err == nil {
			return exitOK
		}
		// The records of the first n lines are in the file: a rerun from
		// the next line neither loses nor repeats one.
		return s.exitWith(failureExit(err), "streamd publish: %v (stdin lines published: %d; rerun from line %d, e.g. with tail -n +%d)", err, n, n+1, n+1)
	}
}

// repairCommand is `streamd repair`: truncate a stream file that writers
// refuse (an end-of-stream frame in the middle, damage after the last good
// frame) to its last frame readers reach. It is a command of its own, not a
// publish flag, so that discarding bytes is always an operator's choice
// made once, after reading what is there, never a side effect of a script
// that publishes; cutting off records that readers skipping the damage
// still read takes --force.
func repairCommand(app *kingpin.Application) action {
	cmd := app.Command("repair", "Truncate a stream file that publish and the daemon refuse to append to (an end-of-stream frame in the middle, "+
		"damage after the last good frame) to its last frame readers reach, saying first what it discards; unless --force, it changes nothing when readers that skip the damage read records after it. Stop every writer of the file first.")
	path := cmd.Arg("file", "Stream file to repair.").Required().String()
	force := cmd.Flag("force", "Truncate also when readers that skip the damage read records after it, which are then lost.").Bool()
	return func(s stdio) int {
		var size int64
		de, next, err := streamfile.Repair(*path, *force, func(de *streamfile.DamageError) {
			fmt.Fprintf(s.out, "%s: readers stop at offset %d: %s\n%s: discarding the %d bytes from offset %d to the end\n",
				*path, de.Offset, de.What, *path, de.Size-de.Offset, de.Offset)
		})
		if fi, serr := os.Stat(*path); serr == nil {
			size = fi.Size()
		}
		var le *streamfile.LossError
		var oe *streamfile.OversizeError
		switch {
		case errors.As(err, &oe):
			return s.exitWith(exitError, "streamd repair: %s: readers stop at offset %d; the frame at offset %d holds a payload of %d bytes, more than streamd reads (%d): "+
				"a record another writer wrote whole, or a damaged size field, which streamd cannot tell apart\n"+
				"streamd repair: nothing was changed: write new records to another file, or run it again with --force to cut the file at offset %d",
				*path, oe.Damage.Offset, oe.Offset, oe.PayloadSize, streamfile.DefaultMaxPayload, oe.Damage.Offset)
		case errors.As(err, &le):
			return s.exitWith(exitError, "streamd repair: %s: readers stop at offset %d: %s\n"+
				"streamd repair: nothing was changed: truncating there would discard %s after it that readers skipping the damage (on_corrupt = \"skip\") still read:\n%s"+
				"streamd repair: to keep them, move the file aside and let writers start a new one (readers read the old one to its end first); to discard them, run it again with --force",
				*path, le.Damage.Offset, le.Damage.What, countRecords(le.Count()), lostRecords(le.Records))
		case err != nil:
			return s.exitWith(failureExit(err), "streamd repair: %v", err)
		case de == nil && next < size:
			fmt.Fprintf(s.out, "%s: nothing to repair: the next append writes at offset %d, over the %d bytes after it "+
				"(a torn last frame, zeros a crash left after it, or a closing end-of-stream frame), as writers do\n", *path, next, size-next)
		case de == nil:
			fmt.Fprintf(s.out, "%s: its records reach its end; nothing to repair\n", *path)
		default:
			fmt.Fprintf(s.out, "%s: truncated to %d bytes; it can be appended to\n", *path, de.Offset)
		}
		return exitOK
	}
}

// lostRecords lists what a repair would discard, a line per key.
func lostRecords(keys []streamfile.KeyRecords) string {
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  key %s: %s, seq %d to %d\n", k.Key, countRecords(k.Count), k.FirstSeq, k.LastSeq)
	}
	return b.String()
}

// countRecords says n records in words.
func countRecords(n int) string {
	if n == 1 {
		return "1 record"
	}
	return fmt.Sprintf("%d records", n)
}
