package daemon

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/retrytimer"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// PositionReport is what `streamd offsets show` says of one subscription:
// its stored position, if any, against the stream file as it is now.
type PositionReport struct {
	Subscription string
	// Stream is the subscription's stream name, "" for a stored position
	// whose subscription is no longer configured.
	Stream string
	// Stored is the stored position; nil when none is stored.
	Stored *offsets.Position
	// FileSize is the stream file's size, -1 when it cannot be read.
	FileSize int64
	// Lag is FileSize minus the stored offset, -1 when it does not apply
	// (nothing stored, another file, an unreadable file). When the stored
	// position is in a file rotated away from the path, it is that file's
	// size minus the offset, plus the records of the files rotated after it
	// and of the file at the path.
	Lag int64
	// Note says what the position means at the next start, or why a value
	// is missing.
	Note string
}

// Positions reports the stored position of each configured subscription,
// then of each stored one that is no longer configured. It reads the
// sidecar and the stream files, and takes no lock. A used state directory
// without its sidecar is an [*offsets.MissingError], as at start.
func Positions(cfg *conf.Config) ([]PositionReport, error) {
	// Without its sidecar, a used state directory has no positions to
	// show, and streamd run refuses to start: say so, and how to go on,
	// as for a corrupt sidecar.
	stored, err := offsets.LoadMarked(cfg.StateDir, retrytimer.SpoolName)
	if err != nil {
		return nil, err
	}
	var out []PositionReport
	for _, sc := range cfg.Subscriptions {
		r := PositionReport{Subscription: sc.Name, Stream: sc.Stream, FileSize: -1, Lag: -1}
		path := streamConfig(cfg, sc.Stream).Path
		size, id, ferr := fileState(path)
		if ferr == nil {
			r.FileSize = size
		} else {
			r.Note = ferr.Error()
		}
		p, ok := stored[sc.Name]
		switch {
		case !ok:
			r.Note = joinNote(r.Note, "no stored position: starts at "+sc.StartAt.String())
		case p.Stream != path:
			r.Note = joinNote(r.Note, "stored for another file path "+p.Stream+": starts over")
		case ferr == nil && p.File == id:
			r.Lag = lagAt(path, p.Offset, size)
		default:
			var note string
			note, r.Lag = replacedNote(sc, path, p, ferr == nil, size)
			r.Note = joinNote(r.Note, note)
		}
		if ok {
			r.Stored = &p
		}
		out = append(out, r)
	}
	for _, name := range slices.Sorted(maps.Keys(stored)) {
		if !slices.ContainsFunc(cfg.Subscriptions, func(sc conf.Subscription) bool { return sc.Name == name }) {
			p := stored[name]
			out = append(out, PositionReport{Subscription: name, Stored: &p, FileSize: -1, Lag: -1, Note: "not in the configuration"})
		}
	}
	return out, nil
}

// WritePositions writes reports to w as the table `streamd offsets show`
// prints: a header line, then a row per report with its columns aligned,
// "-" for a value that is unknown or not stored.
func WritePositions(w io.Writer, reports []PositionReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSTREAM\tOFFSET\tLAST SEQ\tFILE SIZE\tLAG\tCOMMITTED\tNOTE")
	for _, r := range reports {
		offset, seq, committed := "-", "-", "-"
		if p := r.Stored; p != nil {
			offset, seq, committed = fmt.Sprint(p.Offset), fmt.Sprint(p.LastSeq), p.CommittedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Subscription, cmp.Or(r.Stream, "-"), offset, seq,
			orDash(r.FileSize), orDash(r.Lag), committed, r.Note)
	}
	return tw.Flush()
}

// orDash writes n, or "-" when it is unknown (negative).
func orDash(n int64) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// UnknownSubscriptionError is a subscription name that the configuration
// does not have: a mistake of the caller's, made before anything is read.
type UnknownSubscriptionError struct{ Name string }

func (e *UnknownSubscriptionError) Error() string {
	return fmt.Sprintf("no subscription %q in the configuration", e.Name)
}

// StreamFileError is a failure to find a position in a stream file: one
// that cannot be opened or read, or has no such position.
type StreamFileError struct {
	Path string
	Err  error
}

func (e *StreamFileError) Error() string { return e.Path + ": " + e.Err.Error() }

func (e *StreamFileError) Unwrap() error { return e.Err }

// SetPosition stores where the named subscription resumes: start resolved
// to a frame boundary of its stream file as it is now. It takes the state
// directory's lock, so while a daemon runs it refuses with an error that
// wraps the [*offsets.LockedError] and says how to go on; a name that is
// not configured is an [*UnknownSubscriptionError], found before the lock
// is taken; a failure in the stream file is a [*StreamFileError].
func SetPosition(cfg *conf.Config, name string, start tail.Start) (offsets.Position, error) {
	i := slices.IndexFunc(cfg.Subscriptions, func(sc conf.Subscription) bool { return sc.Name == name })
	if i < 0 {
		return offsets.Position{}, &UnknownSubscriptionError{name}
	}
	sc := cfg.Subscriptions[i]
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return offsets.Position{}, err
	}
	// A missing sidecar is created here (one way out of a lost one); a
	// corrupt one is refused with the advice run gives, naming the spool.
	store, err := offsets.Open(cfg.StateDir, offsets.Options{Marker: retrytimer.SpoolName, AllowMissing: true})
	if _, locked := errors.AsType[*offsets.LockedError](err); locked {
		return offsets.Position{}, fmt.Errorf("refusing while streamd runs: %w\nStop the daemon (systemctl stop streamd), set the position, and start it again", err)
	}
	if err != nil {
		return offsets.Position{}, err
	}
	defer store.Close()
	path := streamConfig(cfg, sc.Stream).Path
	pos, err := resolvePosition(path, start, sc.Key)
	if err != nil {
		return offsets.Position{}, &StreamFileError{Path: path, Err: err}
	}
	// Every record from the position set is delivered, also those the
	// last run settled beyond its stored position: they are forgotten
	// first, so that a position stored is never one they could apply to.
	if err := store.ForgetSettled(name); err != nil {
		return offsets.Position{}, err
	}
	if err := store.Set(name, pos); err != nil {
		return offsets.Position{}, err
	}
	return pos, store.Commit()
}

// resolvePosition finds the frame boundary of a start position in the
// stream file, with the file's identity.
func resolvePosition(path string, start tail.Start, key string) (offsets.Position, error) {
	f, err := streamfile.OpenRegular(path)
	if err != nil {
		return offsets.Position{}, err
	}
	defer f.Close()
	h, size, id, err := streamfile.Identify(f)
	if err != nil {
		return offsets.Position{}, err
	}
	off, err := start.Offset(f, h, size, key)
	if err != nil {
		return offsets.Position{}, err
	}
	return offsets.Position{Stream: path, File: id, Offset: off}, nil
}

// lagAt returns the bytes after the position off in the stream file at
// path of the given size, but 0 when all there is after it is an
// end-of-stream frame: a subscription that read every record of a stream
// that ended waits at that frame (which a writer that continues the file
// overwrites), with nothing to settle.
func lagAt(path string, off, size int64) int64 {
	lag := size - off
	if lag <= 0 || lag > maxEOSSpan {
		return lag
	}
	f, err := streamfile.OpenRegular(path)
	if err != nil {
		return lag
	}
	defer f.Close()
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		return lag
	}
	d := streamfile.NewDecoder(f, h, off)
	d.ReadSize = int(lag) // not the default 256 KiB
	if rec, err := d.Next(); err == nil && rec.IsEOS() && rec.End == size {
		return 0
	}
	return lag
}

// maxEOSSpan bounds the bytes an end-of-stream frame spans, with a beacon
// it may straddle, so that lagAt reads the file only when the lag may be
// one.
const maxEOSSpan = 64 << 10

// fileState returns the size and identity of the stream file at path. A
// named pipe there is refused, not waited on ([streamfile.OpenRegular]):
// the daemon's stop waits for this.
func fileState(path string) (int64, streamfile.Identity, error) {
	f, err := streamfile.OpenRegular(path)
	if err != nil {
		return 0, streamfile.Identity{}, err
	}
	defer f.Close()
	_, size, id, err := streamfile.Identify(f)
	return size, id, err
}

// lag returns the bytes subscription sc has yet to settle of the stream at
// path, whose file there has size (-1: there is none) and identity id
// (found false when it has no header to identify it by), counted as
// streamd offsets show counts them; false when that is not known.
func (d *Daemon) lag(sc conf.Subscription, path string, size int64, id streamfile.Identity, found bool) (int64, bool) {
	p, ok := d.store.Get(sc.Name)
	switch {
	case !ok || p.Stream != path:
		// No position yet: it starts at the beginning, or at a start_at
		// place, which its start stores.
		return max(size-streamfile.HeaderSize, 0), size >= 0 && !sc.StartAt.IsPlace()
	case found && p.File == id && size < p.Offset:
		// Truncated in place and written again under the same header:
		// read again from its beginning.
		return max(size-streamfile.HeaderSize, 0), true
	case found && p.File == id:
		return lagAt(path, p.Offset, size), true
	}
	if _, lag := replacedNote(sc, path, p, found, size); lag >= 0 {
		return lag, true
	}
	// The file it reads is gone from the directory (it may read on in
	// it, open), or a replay reads on in a rotated file: at least the
	// file at the path.
	return max(size-streamfile.HeaderSize, 0), size >= 0
}

// replacedNote says where subscription sc starts when its stored position p
// is not in the file at path (of size, when found) and returns the lag:
// when a live subscription reads on in the file a rotation renamed within
// the directory (or in a copy of it, when it was truncated after the copy
// was made: copytruncate), the rest of it, the files rotated after it,
// and the records of the file at the path; -1 otherwise. See
// tail.Options.Resume.
func replacedNote(sc conf.Subscription, path string, p offsets.Position, found bool, size int64) (string, int64) {
	var f *os.File
	copied := false
	if !sc.Replay {
		f, _ = streamfile.Locate(path, p.File)
		if f == nil {
			f, _ = streamfile.LocateCopy(path, p.File, p.Offset+1)
			copied = f != nil
		}
	}
	var fi os.FileInfo
	if f != nil {
		defer f.Close()
		fi, _ = f.Stat()
	}
	if fi == nil {
		if !found {
			return "", -1
		}
		return "the file was replaced since: starts at its beginning", -1
	}
	lag, later := fi.Size()-p.Offset, 0
	for after := p.File.CreatedAtMs; ; later++ {
		next, err := streamfile.NextRotated(path, p.File.FileName, after)
		if err != nil || next == nil {
			break
		}
		_, nsize, id, err := streamfile.Identify(next)
		next.Close()
		if err != nil {
			break
		}
		lag += nsize - streamfile.HeaderSize
		after = id.CreatedAtMs
	}
	if found {
		lag += max(size-streamfile.HeaderSize, 0)
	}
	note := "the file was rotated to " + f.Name() + " since: its rest is read first"
	if copied {
		note = "the file was copied to " + f.Name() + " and truncated since (copytruncate): the copy's rest is read first"
	}
	switch {
	case later == 1:
		note += ", then the file rotated after it"
	case later > 1:
		note += fmt.Sprintf(", then the %d files rotated after it", later)
	}
	return note + ", then the file at the path", lag
}

// streamConfig returns the configuration of the named stream, the zero
// Stream if none is named so.
func streamConfig(cfg *conf.Config, name string) conf.Stream {
	i := slices.IndexFunc(cfg.Streams, func(st conf.Stream) bool { return st.Name == name })
	if i < 0 {
		return conf.Stream{}
	}
	return cfg.Streams[i]
}

// joinNote joins two parts of a note, either of which may be empty.
func joinNote(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}
