package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/streamfile"
)

// headerFlags collects repeated --header=name=value flags.
type headerFlags struct{ h envelope.Headers }

func (f *headerFlags) String() string { return "" }

// IsCumulative makes the flag repeatable.
func (f *headerFlags) IsCumulative() bool { return true }

func (f *headerFlags) Set(v string) error {
	switch name, value, ok := strings.Cut(v, "="); {
	case !ok:
		return fmt.Errorf("header %q has no '=': write name=value", v)
	case name == "":
		return fmt.Errorf("header %q has an empty name", v)
	default:
		f.h.Set(name, []byte(value))
		return nil
	}
}

// publishCommand is `streamd publish`: append stdio-format lines from
// stdin to a stream file.
func publishCommand(app *kingpin.Application) action {
	cmd := app.Command("publish", "Append one record per stdin line (SeaStreamer stdio format) to a stream file, created when missing. "+
		"A line's bracketed key (and shard) wins over --key; sequences continue each key's last one; timestamps are the current time.")
	path := cmd.Flag("file", "Stream file to append to (created when missing).").Required().String()
	key := cmd.Flag("key", "Stream key for lines without a bracketed key.").String()
	interval := cmd.Flag("beacon-interval", "Beacon interval in bytes when the file is created: a positive multiple of 1024.").
		Default(strconv.Itoa(streamfile.DefaultBeaconInterval)).Uint()
	var headers headerFlags
	cmd.Flag("header", "Header for every record (repeatable).").PlaceHolder("name=value").SetValue(&headers)
	return func(s stdio) int {
		if err := streamfile.CheckBeaconInterval(int64(*interval)); err != nil {
			fmt.Fprintf(s.err, "streamd publish: %v\n", err)
			return exitUsage
		}
		if *key != "" {
			if err := errors.Join(streamfile.ValidKey(*key), streamfile.ReservedKey(*key)); err != nil {
				fmt.Fprintf(s.err, "streamd publish: --key: %v\n", err)
				return exitUsage
			}
		}
		return publish(s, *path, *key, headers.h, uint32(*interval))
	}
}

// publish appends the lines of s.in to the file at path.
func publish(s stdio, path, key string, headers envelope.Headers, interval uint32) int {
	log := slog.New(slog.NewTextHandler(s.err, nil))
	n, err := streamfile.PublishFile(path, s.in, streamfile.LineOptions{Key: key, Headers: headers},
		streamfile.AppendOptions{Create: true, BeaconInterval: interval, Log: log})
	if _, noKey := errors.AsType[*streamfile.NoKeyError](err); noKey {
		err = fmt.Errorf("%w and --key is not set", err)
	} else if _, damaged := errors.AsType[*streamfile.DamageError](err); damaged {
		err = fmt.Errorf("%w; `streamd repair %s` does so after saying what it discards", err, path)
	}
	if err != nil {
		fmt.Fprintf(s.err, "streamd publish: %v (%d records were published before it)\n", err, n)
		if pe, ok := errors.AsType[*fs.PathError](err); ok && pe.Op == "open" {
			return exitUsage // the file cannot be opened
		}
		return exitError
	}
	return exitOK
}
