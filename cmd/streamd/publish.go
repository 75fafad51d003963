package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/pipe"
	"github.com/streamd/streamd/streamfile"
)

// headerFlags collects repeated --header=name=value flags.
type headerFlags struct{ h envelope.Headers }

func (f *headerFlags) String() string { return "" }

func (f *headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("header %q has no '=': write name=value", v)
	}
	if name == "" {
		return fmt.Errorf("header %q has an empty name", v)
	}
	f.h.Set(name, []byte(value))
	return nil
}

const (
	publishBatchFrames = 1024
	publishBatchBytes  = 1 << 20
)

func runPublish(args []string, s stdio) int {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	fs.SetOutput(s.err)
	path := fs.String("file", "", "stream file to append to (created when missing)")
	key := fs.String("key", "", "stream key for lines without a bracketed key")
	interval := fs.Uint("beacon-interval", streamfile.DefaultBeaconInterval, "beacon interval in bytes when the file is created: a positive multiple of 1024")
	var headers headerFlags
	fs.Var(&headers, "header", "header `name=value` for every record (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(s.err, "usage: streamd publish --file=PATH [--key=KEY] [--header=name=value ...] [--beacon-interval=N] < lines")
		fmt.Fprintln(s.err, "\nEach stdin line in the SeaStreamer stdio format becomes one record. The bracketed")
		fmt.Fprintln(s.err, "key (and shard) of a line win over --key; sequence numbers continue the key's last")
		fmt.Fprintln(s.err, "sequence in the file and timestamps are the current time.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	switch {
	case fs.NArg() != 0:
		fmt.Fprintf(s.err, "streamd publish: unexpected argument %q (payloads come from stdin)\n", fs.Arg(0))
		return exitUsage
	case *path == "":
		fmt.Fprintln(s.err, "streamd publish: --file is required")
		return exitUsage
	case *interval == 0 || *interval%1024 != 0 || *interval > 1<<31:
		fmt.Fprintf(s.err, "streamd publish: invalid beacon interval %d: use a positive multiple of 1024\n", *interval)
		return exitUsage
	}
	if *key != "" {
		if err := streamfile.ValidKey(*key); err != nil {
			fmt.Fprintf(s.err, "streamd publish: --key: %v\n", err)
			return exitUsage
		}
	}
	p := &publisher{
		path:    *path,
		key:     *key,
		headers: headers.h,
		create: streamfile.CreateOptions{Create: true, RefuseReplaced: true, Header: streamfile.Header{
			FileName:       baseName(*path),
			BeaconInterval: uint32(*interval),
		}},
	}
	n, err := p.run(s.in)
	if cerr := p.close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(s.err, "streamd publish: %v (%d records were published before it)\n", err, n)
		return exitError
	}
	return exitOK
}

// publisher turns stdin lines into batches of frames.
type publisher struct {
	path    string
	key     string
	headers envelope.Headers
	create  streamfile.CreateOptions

	w     *streamfile.Writer // opened at the first batch, so bad input writes nothing
	batch []streamfile.Frame
	bytes int
	arena []byte
}

func (p *publisher) run(in io.Reader) (published int, err error) {
	r := bufio.NewReaderSize(in, 256<<10)
	for lineNo := 1; ; lineNo++ {
		line, rerr := r.ReadSlice('\n')
		if errors.Is(rerr, bufio.ErrBufferFull) {
			return published, fmt.Errorf("stdin line %d is longer than %d bytes", lineNo, r.Size())
		}
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return published, fmt.Errorf("read stdin: %w", rerr)
		}
		if len(line) > 0 {
			if err := p.add(bytesTrimNewline(line), lineNo); err != nil {
				return published, err
			}
		}
		if rerr != nil || r.Buffered() == 0 || len(p.batch) >= publishBatchFrames || p.bytes >= publishBatchBytes {
			n, err := p.flush()
			published += n
			if err != nil {
				return published, err
			}
		}
		if rerr != nil {
			return published, nil
		}
	}
}

func bytesTrimNewline(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\n' {
		return b[:len(b)-1]
	}
	return b
}

// add parses one line into a frame of the batch.
func (p *publisher) add(line []byte, lineNo int) error {
	l, err := pipe.ParseLine(line)
	if err != nil {
		return fmt.Errorf("stdin line %d: %w", lineNo, err)
	}
	key := p.key
	if l.HasStreamKey {
		key = string(l.StreamKey)
	}
	if key == "" {
		return fmt.Errorf("stdin line %d has no [key] and --key is not set", lineNo)
	}
	// The payload aliases the reader's buffer: copy it into the batch arena.
	start := len(p.arena)
	p.arena = envelope.AppendEncode(p.arena, p.headers, l.Payload, false)
	p.batch = append(p.batch, streamfile.Frame{
		Key:         key,
		Shard:       l.ShardID,
		TimestampMs: uint64(time.Now().UnixMilli()),
		Payload:     p.arena[start:len(p.arena):len(p.arena)],
	})
	p.bytes += len(p.arena) - start
	return nil
}

// flush appends the batch to the file at the path. When another file took
// the path (rotated, or removed and created again), what was written to the
// old one is synced and the batch goes to the file at the path, where its
// readers look, continuing that file's sequence numbers.
func (p *publisher) flush() (int, error) {
	if len(p.batch) == 0 {
		return 0, nil
	}
	err := p.open()
	if err == nil {
		err = p.w.Publish(p.batch)
	}
	if errors.Is(err, streamfile.ErrReplaced) {
		err = p.close()
		p.w = nil
		if err == nil {
			err = p.open()
		}
		if err == nil {
			err = p.w.Publish(p.batch)
		}
	}
	if err != nil {
		return 0, err
	}
	n := len(p.batch)
	p.batch, p.bytes = p.batch[:0], 0
	p.arena = nil // frames of the next batch must not share it with the written ones
	return n, nil
}

// open opens the file at the path, creating it when it is missing, unless
// it is open.
func (p *publisher) open() error {
	if p.w != nil {
		return nil
	}
	p.create.Header.CreatedAtMs = uint64(time.Now().UnixMilli())
	w, err := streamfile.OpenWriter(p.path, p.create)
	if err != nil {
		return err
	}
	p.w = w
	return nil
}

// close makes what was written durable.
func (p *publisher) close() error {
	if p.w == nil {
		return nil
	}
	return errors.Join(p.w.Sync(), p.w.Close())
}

func baseName(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[i+1:]
	}
	return path
}
