package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/streamd/streamd/envelope"
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
	var a *streamfile.Appender // opened at the first batch, so bad input writes nothing
	n, err := streamfile.PublishLines(s.in, streamfile.LineOptions{Key: *key, Headers: headers.h}, func(batch []streamfile.Frame) error {
		if a == nil {
			var err error
			if a, err = streamfile.OpenAppender(*path, streamfile.AppendOptions{Create: true, BeaconInterval: uint32(*interval)}); err != nil {
				return err
			}
		}
		return a.Publish(batch)
	})
	var nk *streamfile.NoKeyError
	if errors.As(err, &nk) {
		err = fmt.Errorf("%w and --key is not set", err)
	}
	if a != nil {
		if cerr := errors.Join(a.Sync(), a.Close()); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(s.err, "streamd publish: %v (%d records were published before it)\n", err, n)
		return exitError
	}
	return exitOK
}
