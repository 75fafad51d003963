package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// runOffsets is `streamd offsets show|set`: read or rewrite the stored
// positions of a configuration's subscriptions.
func runOffsets(args []string, s stdio) int {
	if len(args) == 0 || (args[0] != "show" && args[0] != "set") {
		fmt.Fprintln(s.err, "usage: streamd offsets show --config.file=PATH")
		fmt.Fprintln(s.err, "       streamd offsets set --config.file=PATH --subscription=NAME --to=beginning|end|seq:N|time:RFC3339|offset:N")
		return exitUsage
	}
	verb := args[0]
	fset := flag.NewFlagSet("offsets "+verb, flag.ContinueOnError)
	fset.SetOutput(s.err)
	path := fset.String("config.file", daemon.DefaultConfigFile(), "configuration file")
	name := fset.String("subscription", "", "subscription to move (set)")
	to := fset.String("to", "", "new position (set): beginning, end, seq:N, time:RFC3339 or offset:N")
	if err := fset.Parse(args[1:]); err != nil {
		return exitUsage
	}
	cfg, err := daemon.LoadConfig(*path, daemon.ModeRun)
	if err != nil {
		fmt.Fprintf(s.err, "streamd offsets: couldn't load configuration (--config.file=%q):\n%v\n", *path, err)
		return exitError
	}
	if verb == "show" {
		return showOffsets(cfg, s)
	}
	if *name == "" || *to == "" {
		fmt.Fprintln(s.err, "streamd offsets set: --subscription and --to are required")
		return exitUsage
	}
	return setOffset(cfg, *name, *to, s)
}

// showOffsets prints each subscription's stored position, its file's size
// and the lag between them.
func showOffsets(cfg *daemon.Config, s stdio) int {
	stored, err := offsets.Load(cfg.StateDir)
	if err != nil {
		fmt.Fprintf(s.err, "streamd offsets show: %v\n", err)
		return exitError
	}
	tw := tabwriter.NewWriter(s.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSTREAM\tOFFSET\tLAST SEQ\tFILE SIZE\tLAG\tCOMMITTED\tNOTE")
	for _, sc := range cfg.Subscriptions {
		path := streamPath(cfg, sc.Stream)
		size, id, ferr := fileInfo(path)
		p, ok := stored[sc.Name]
		sizeText, lag, note := "-", "-", ""
		if ferr == nil {
			sizeText = fmt.Sprint(size)
		} else {
			note = ferr.Error()
		}
		switch {
		case !ok:
			note = joinNote(note, "no stored position: starts at "+sc.StartAt.String())
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t%s\t-\t-\t%s\n", sc.Name, sc.Stream, sizeText, note)
			continue
		case p.Stream != path:
			note = joinNote(note, "stored for another file path "+p.Stream+": starts over")
		case ferr == nil && p.File != id:
			note = joinNote(note, "the file was replaced since: starts at its beginning")
		case ferr == nil:
			lag = fmt.Sprint(size - p.Offset)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", sc.Name, sc.Stream, p.Offset, p.LastSeq, sizeText, lag,
			p.CommittedAt.UTC().Format(time.RFC3339), note)
	}
	for name := range stored {
		if !slices.ContainsFunc(cfg.Subscriptions, func(sc daemon.SubscriptionConfig) bool { return sc.Name == name }) {
			fmt.Fprintf(tw, "%s\t-\t%d\t%d\t-\t-\t%s\tnot in the configuration\n", name, stored[name].Offset, stored[name].LastSeq,
				stored[name].CommittedAt.UTC().Format(time.RFC3339))
		}
	}
	if err := tw.Flush(); err != nil {
		return exitError
	}
	return exitOK
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// setOffset rewinds or skips one subscription. It takes the state
// directory's lock, so it refuses while a daemon runs.
func setOffset(cfg *daemon.Config, name, to string, s stdio) int {
	i := slices.IndexFunc(cfg.Subscriptions, func(sc daemon.SubscriptionConfig) bool { return sc.Name == name })
	if i < 0 {
		fmt.Fprintf(s.err, "streamd offsets set: no subscription %q in the configuration\n", name)
		return exitUsage
	}
	sc := cfg.Subscriptions[i]
	start, err := tail.ParseStart(to)
	if err != nil {
		fmt.Fprintf(s.err, "streamd offsets set: --to: %v\n", err)
		return exitUsage
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		fmt.Fprintf(s.err, "streamd offsets set: %v\n", err)
		return exitError
	}
	store, err := offsets.Open(cfg.StateDir, offsets.Options{})
	if err != nil {
		var le *offsets.LockedError
		if errors.As(err, &le) {
			fmt.Fprintf(s.err, "streamd offsets set: refusing while streamd runs: %v\nStop the daemon (systemctl stop streamd), set the position, and start it again.\n", err)
		} else {
			fmt.Fprintf(s.err, "streamd offsets set: %v\n", err)
		}
		return exitError
	}
	defer store.Close()
	path := streamPath(cfg, sc.Stream)
	pos, err := resolvePosition(path, start, sc.Key)
	if err != nil {
		fmt.Fprintf(s.err, "streamd offsets set: %s: %v\n", path, err)
		return exitError
	}
	if err := store.Set(name, pos); err != nil {
		fmt.Fprintf(s.err, "streamd offsets set: %v\n", err)
		return exitError
	}
	if err := store.Commit(); err != nil {
		fmt.Fprintf(s.err, "streamd offsets set: %v\n", err)
		return exitError
	}
	fmt.Fprintf(s.out, "streamd: subscription %q now resumes at offset %d of %s (%s)\n", name, pos.Offset, path, to)
	return exitOK
}

// resolvePosition finds the frame boundary of a start position in the
// stream file, with the file's identity.
func resolvePosition(path string, start tail.Start, key string) (offsets.Position, error) {
	sf, err := openStreamFile(path)
	if err != nil {
		return offsets.Position{}, err
	}
	defer sf.f.Close()
	off, err := start.Offset(sf.f, sf.h, sf.size, key)
	if err != nil {
		return offsets.Position{}, err
	}
	return offsets.Position{Stream: path, File: sf.id, Offset: off}, nil
}

// streamFile is an open stream file with its header, size and identity.
type streamFile struct {
	f    *os.File
	h    streamfile.Header
	size int64
	id   streamfile.Identity
}

func openStreamFile(path string) (*streamFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sf := &streamFile{f: f}
	sf.h, err = streamfile.ReadHeader(f)
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil {
			sf.size = fi.Size()
			sf.id, err = streamfile.IdentityOf(fi, sf.h)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

func streamPath(cfg *daemon.Config, name string) string {
	for _, st := range cfg.Streams {
		if st.Name == name {
			return st.Path
		}
	}
	return ""
}

// fileInfo returns the size and identity of a stream file.
func fileInfo(path string) (int64, streamfile.Identity, error) {
	sf, err := openStreamFile(path)
	if err != nil {
		return 0, streamfile.Identity{}, err
	}
	sf.f.Close()
	return sf.size, sf.id, nil
}
