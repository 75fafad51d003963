package tail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/streamfile"
)

// DefaultPollInterval is how often a follower looks at the file when no
// notification arrives.
const DefaultPollInterval = time.Second

// flushBytes is how many bytes a follower reads between two reports to the
// [Observer] while it catches up.
const flushBytes = 1 << 20

// ErrClosed is returned by [Follower.Next] after [Follower.Close].
var ErrClosed = errors.New("tail: follower is closed")

// Options configure a [Follower].
type Options struct {
	// Path is the stream file to follow. It must exist when [New] is
	// called, unless Held is given (the follower then reads Held on and
	// waits for a file at the path). Its directory is watched, so that a file replaced at the path
	// is noticed, and so is the directory of the file a symlink at the
	// path names, whose appends are notified there.
	Path string
	// Key is the stream key that seq: and time: starts look for.
	Key string
	// Start is where to begin when Resume does not apply.
	Start Start
	// Resume is a stored position. It applies when the file at Path has the
	// identity Resume.File. Otherwise, unless Replay is set, the file with
	// that identity in the directory of Path (or of the file a symlink there
	// names), where a rotation renamed it, is read from the position to its
	// end first, and the files rotated after it and the one at Path from
	// their beginning after it, as after rotations while following; so is
	// a copy of it there, when it was truncated in place after the copy
	// was made (copytruncate). Failing that, the file at Path is another
	// one than the position was stored for, and it is read from its
	// beginning (logged, and counted as [EventReplaced]).
	Resume *Position
	// Held, if set, is the file of Resume, kept open by whoever read it
	// before ([Follower.Hold]): a reload that starts a subscription again
	// hands it over, so that a file rotated away from the path and then
	// removed or compressed (logrotate without delaycompress) is still read
	// on from the position. It is used when the file at Path is not
	// Resume's, before the directory is looked in. The follower owns it
	// from New on, and closes it when it is not of use.
	Held *os.File
	// HeldAfter is the files the follower before had gone on to after
	// Held's ([Follower.HoldAhead]), in the order it read them: they are
	// read after it, each from its beginning, before the file at the path,
	// as files seen at the path while Held's was read to its end, even
	// when a rotation removed them meanwhile. Used only with Held's file
	// read in place of the file at the path. The follower owns them from
	// New on, and closes those not of use.
	HeldAfter []*os.File
	// Replay reads to the end of the data (or the end-of-stream frame) and
	// finishes there, instead of following the file as it grows.
	Replay bool
	// PollInterval is how long the follower waits for a notification
	// before it looks at the file anyway. Zero means [DefaultPollInterval].
	PollInterval time.Duration
	// PollOnly turns notifications off: the file is only looked at every
	// PollInterval.
	PollOnly bool
	// RotationGrace is how long a file that another file replaced at the
	// path must stay quiet (not grow) before the follower leaves it for
	// the new one: a producer that kept its descriptor (the upstream
	// writer under logrotate's create) may go on writing to it for a while
	// after the switch. Zero leaves it as soon as it was read to its end
	// under a shared lock.
	RotationGrace time.Duration
	// OnCorrupt says what happens at a corrupt frame.
	OnCorrupt CorruptPolicy
	// OnWait, if set, is called on the goroutine calling Next before Next
	// waits for the file to change (or, after a failed read or on a file
	// that is not a stream file, before it tries again): a caller that
	// gathers the records it reads hands them on there, so that none waits
	// for the next write. It must not call the Follower, but for
	// [Follower.Look]; while it runs, Next's ctx is not watched.
	OnWait func()
	// Watcher, if set, delivers the file notifications, shared with other
	// followers; nil gives the follower a Watcher of its own.
	Watcher *Watcher
	// Logger receives the follower's log lines; nil discards them.
	Logger *slog.Logger
	// Observer is told what the follower reads and what happens to the
	// file; nil ignores it.
	Observer Observer
}

// Position is a place in one particular stream file.
type Position struct {
	// File is the identity of the file the offset belongs to.
	File streamfile.Identity
	// Offset is where the next frame starts.
	Offset int64
}

// Record is a frame as a [Follower] delivers it: the frame, where it was
// found, and in which file. The frame is the decoder's own record, not a
// copy: like its payload, it is valid until the next call to Next.
type Record struct {
	*streamfile.Record
	// File is the identity of the file the record was read from.
	File streamfile.Identity
}

// file is what a follower needs of an open stream file.
type file interface {
	io.ReaderAt
	Stat() (os.FileInfo, error)
	Close() error
}

// openFile opens the stream file name for reading: a regular file,
// anything else refused without waiting ([streamfile.OpenRegular]).
func openFile(name string) (file, error) {
	f, err := streamfile.OpenRegular(name)
	if err != nil {
		return nil, err // not a nil *os.File in a non-nil file
	}
	return f, nil
}

// testHooks let the tests of this package act at given points.
type testHooks struct {
	onEvent func() // in the watch goroutine, before each notification is handled
	open    func(string) (file, error)
}

// Follower reads the records of one stream file as the file grows, and
// follows the path through truncation, replacement and removal; see the
// package documentation.
//
// A Follower is not safe for concurrent use: one goroutine calls Next, and
// Close once Next has returned.
type Follower struct {
	opts   Options
	path   string // absolute
	dir    string // watched directory
	target string // path as notifications name it
	log    *slog.Logger
	obs    Observer
	hooks  testHooks

	// The open file and how it is read (this file).
	f        file
	id       streamfile.Identity
	hdr      streamfile.Header
	rawHdr   [streamfile.HeaderSize]byte
	dec      *streamfile.Decoder // nil until the header is complete
	started  bool                // the start position was applied
	pending  *streamfile.Target  // pass over frames until one reaches it
	lastSize int64               // file size at the last look
	// readTrouble: the open file cannot be read. It is tried again until
	// it can.
	readTrouble ratelog.Trouble
	// headerTrouble: the open file is not a stream file. A live follower
	// waits until it is replaced, or rewritten with a header.
	headerTrouble ratelog.Trouble
	// told is the trouble the Observer was told of last, "" when none
	// lasts (troubled, untroubled).
	told string

	rec Record
	err error // returned by every later Next: io.EOF after the end of stream, ErrClosed, or a fatal error
	// replayEnd: err is the io.EOF of a replay at the end of the data,
	// which ReadOn may lift.
	replayEnd bool

	records   int64 // delivered since the last report to the Observer
	reportPos int64 // read position at the last report

	damage  damageState  // damaged bytes in the open file (damage.go)
	last    lastRecord   // of the open file; zero before its first
	replace replaceState // the path when it does not name the open file (replace.go)
	torn    tornState    // the data ending inside a frame (torn.go)

	// Wake-ups (watch.go).
	watch      *watch   // nil until the first wait, and with PollOnly
	ownWatcher *Watcher // the follower's own, without Options.Watcher
	watching   bool     // the directory is being watched
	link       linkWatch
	watchLog   ratelog.Limiter
	timer      *time.Timer

	// reading is when the read or stat of the open file under way began;
	// 0 when none is (timedFile, Stalled).
	reading atomic.Int64
	// reads counts the reads of the open file (timedFile): a record the
	// decoder returns after one may come from bytes read after the file
	// was rewritten in place. looked is reads when a wake-up last looked
	// at the file's size and header (check): the read after it needs no
	// look of its own.
	reads, looked uint64
}

// New opens the file at opts.Path and finds where reading starts. It starts
// no goroutine; [Follower.Next] sets up the watch when it first has to wait.
// If the header is not complete yet, a live follower waits for it in Next,
// and resolves the start position then.
func New(opts Options) (*Follower, error) {
	return newFollower(opts, testHooks{})
}

func newFollower(opts Options, hooks testHooks) (*Follower, error) {
	held, after := opts.Held, opts.HeldAfter
	defer func() {
		if held != nil {
			held.Close() // not of use
		}
		for _, f := range after {
			f.Close()
		}
	}()
	if opts.Path == "" {
		return nil, errors.New("tail: no path to follow")
	}
	if opts.Start.needsKey() && opts.Key == "" {
		return nil, fmt.Errorf("tail: start position %s needs a stream key", opts.Start)
	}
	if opts.Key != "" {
		if err := streamfile.ValidKey(opts.Key); err != nil {
			return nil, fmt.Errorf("tail: %w", err)
		}
	}
	if opts.PollInterval < 0 {
		return nil, fmt.Errorf("tail: poll interval %v is negative", opts.PollInterval)
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.OnCorrupt > StopOnCorrupt {
		return nil, fmt.Errorf("tail: unknown corrupt-frame policy %d", opts.OnCorrupt)
	}
	abs, err := filepath.Abs(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("tail: %w", err)
	}
	if hooks.open == nil {
		hooks.open = openFile
	}
	fl := &Follower{
		opts:   opts,
		path:   abs,
		dir:    filepath.Dir(abs),
		log:    opts.Logger,
		obs:    opts.Observer,
		hooks:  hooks,
		damage: noDamage(),
	}
	// fsnotify names events as the watched path, a slash and the name.
	fl.target = fl.dir + "/" + filepath.Base(abs)
	if fl.log == nil {
		fl.log = slog.New(slog.DiscardHandler)
	}
	fl.log = fl.log.With("component", "tail", "path", abs)
	if fl.obs == nil {
		fl.obs = nopObserver{}
	}
	fl.f, err = fl.open(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist) && fl.followHeld(&held):
		fl.seeHeldAfter(&after)
	case err != nil:
		return nil, fmt.Errorf("tail: %w", err)
	case fl.resumeRotated(&held) == foundHeld:
		fl.seeHeldAfter(&after)
	}
	if _, err := fl.readHeader(); err != nil {
		return nil, errors.Join(err, fl.f.Close())
	}
	return fl, nil
}

// Header returns the header of the file records are read from, or the zero
// Header while it is incomplete.
func (fl *Follower) Header() streamfile.Header { return fl.hdr }

// Position returns the file and offset where the next record will be read
// from. Before the header of the file is complete, it is the zero Position.
func (fl *Follower) Position() Position {
	if fl.hdr.BeaconInterval == 0 {
		return Position{}
	}
	return Position{File: fl.id, Offset: fl.pos()}
}

// Next returns the next record, waiting for it if needed. The record and its
// payload are valid until the next call. Next returns:
//   - io.EOF after the end-of-stream frame (which is returned as a record,
//     see [streamfile.Frame.IsEOS]), and, in replay mode, at the end of the
//     data;
//   - ctx.Err() when ctx is done while it waits; while it catches up with a
//     backlog, it notices ctx within a MiB of reading;
//   - in replay mode, an error wrapping [streamfile.ErrTruncated] when the
//     data ends inside a frame;
//   - with [StopOnCorrupt], the [*streamfile.ChecksumError] or
//     [*streamfile.FormatError], wrapped;
//   - in replay mode, an error for a file that is not a stream file or
//     cannot be read.
//
// A live follower does not fail on a file it cannot read: an I/O error is
// logged and the read tried again at the same offset at each wake-up, and
// a replacement file that cannot be opened (permissions, not a regular
// file) is counted as [EventReplaced], logged, and tried again likewise
// while the position stays at the end of the old file; a file that is not a
// stream file (a wrong file copied over the path) is counted as
// [EventFormat], and waited on until a stream file replaces it. Each is
// logged at once, then at most every 10 s, and once more when it passes.
//
// Every error but ctx.Err() is returned by every later call too, but for
// the io.EOF of a replay's end, which [Follower.ReadOn] may lift.
func (fl *Follower) Next(ctx context.Context) (*Record, error) {
	if fl.err != nil {
		return nil, fl.err
	}
	for {
		if fl.dec == nil {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			ready, err := fl.prepare()
			_, badHeader := errors.AsType[*streamfile.HeaderError](err)
			switch {
			case badHeader && !fl.opts.Replay:
				if err := fl.notStreamFile(ctx, err); err != nil {
					return nil, err
				}
				continue
			case err != nil && !fl.retryable(err):
				return nil, fl.fail(err)
			case err != nil:
				if err := fl.readFailed(ctx, err); err != nil {
					return nil, err
				}
				continue
			}
			if fl.readTrouble.Failing() {
				fl.passed(&fl.readTrouble, "stream file can be read again", "offset", fl.pos())
			}
			if fl.headerTrouble.Failing() {
				fl.passed(&fl.headerTrouble, "the file at the path is a stream file again")
			}
			if !ready {
				if err := fl.idle(ctx, io.EOF); err != nil {
					return nil, err
				}
				continue
			}
		} else if fl.dec.Pos()-fl.reportPos >= flushBytes {
			// Catching up: report, and notice a cancellation.
			fl.report()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		reads := fl.reads
		rec, err := fl.dec.Next()
		// A read made since the file was last looked at (catching up, no
		// wake-up between: a wake-up looks before it reads) may have found
		// it truncated and written again under a new header, with frames
		// where the old ones were: the record would be the new file's,
		// read from its middle.
		if err == nil && fl.reads != reads && reads != fl.looked && fl.changedInPlace(rec.Offset, true) {
			continue
		}
		if err == nil {
			if !fl.torn.since.IsZero() {
				fl.tornPassed()
			}
			d := &fl.damage
			d.recheckAt, d.replayRecheckAt, d.goodEnd = -1, -1, rec.End
			if d.cutChecksum {
				d.cutAt, d.cutChecksum = -1, false // writers step over the damage before a good frame
			}
			if fl.readTrouble.Failing() {
				fl.passed(&fl.readTrouble, "stream file can be read again", "offset", rec.Offset)
			}
			if fl.pending != nil || rec.IsEOS() {
				if !fl.deliver(rec) {
					continue
				}
			}
			fl.records++
			if fl.replace.draining {
				fl.replace.drained++
			}
			if fl.err != nil { // the end of stream
				fl.report()
			}
			fl.rec.Record = rec
			fl.last = lastRecordOf(rec)
			return &fl.rec, nil
		}
		var ce *streamfile.ChecksumError
		var fe *streamfile.FormatError
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, streamfile.ErrTruncated):
			// The read worked (the decoder reports a failed one), though
			// it found no whole frame: a read error before it has
			// passed, also on a stream gone quiet.
			if fl.readTrouble.Failing() {
				fl.passed(&fl.readTrouble, "stream file can be read again", "offset", fl.pos())
			}
			if err := fl.idle(ctx, err); err != nil {
				return nil, err
			}
		case errors.As(err, &ce) && fl.atLeftovers(ce.Offset), errors.As(err, &fe) && fl.atLeftovers(fe.Offset):
			// A crash's leftovers: wait at them as at a torn frame.
			if err := fl.idle(ctx, streamfile.ErrTruncated); err != nil {
				return nil, err
			}
		case errors.As(err, &ce):
			if fl.changedInPlace(ce.Offset, false) || fl.readAgain(ce.Offset) {
				continue
			}
			if err := fl.damaged(EventChecksum, err, ce.Offset); err != nil {
				return nil, err
			}
		case errors.As(err, &fe):
			if fl.changedInPlace(fl.dec.Pos(), false) || fl.readAgain(fl.dec.Pos()) {
				continue
			}
			if err := fl.damaged(EventFormat, err, fe.Offset); err != nil {
				return nil, err
			}
			// Damage in a beacon that the frame spans lies after the frame's
			// start: the search starts there, not before the beacon, past
			// which it would only find the beacon after it.
			fl.damage.skipAt, fl.damage.skipFrom, fl.dec = fl.dec.Pos(), max(fl.dec.Pos(), fe.Offset), nil
		default:
			// The decoder stays at the frame it could not read.
			err = &readError{fmt.Errorf("tail: %s: %w", fl.path, err)}
			if !fl.retryable(err) {
				return nil, fl.fail(err)
			}
			if err := fl.readFailed(ctx, err); err != nil {
				return nil, err
			}
		}
	}
}

// ReadOn lets a replay read on after Next returned io.EOF at the end of the
// data: the next call reads what was appended since, up to the new end. A
// caller that reads ahead of its handling calls it once its handling
// caught up, so that the replay ends where the handling found the end, as
// it would without reading ahead: a retry copy appended before then is
// read. It reports false, changing nothing, after any other end or error
// (an end-of-stream frame, a file that ends inside a frame).
func (fl *Follower) ReadOn() bool {
	if !fl.replayEnd || fl.err != io.EOF {
		return false
	}
	fl.replayEnd, fl.err = false, nil
	return true
}

// Stalled returns how long the read or stat of the followed file under
// way has been running, or the wait for a writer to release the file's
// lock (a replay reading again a frame cut short, a replaced file read to
// its end before the switch), 0 when none is: a read that hangs (a stuck
// disk or network file system), or a writer that holds its lock as long,
// grows it, which the systemd watchdog must learn. Waiting for the file to
// change is not a stall. Unlike the other methods, it may be called from
// any goroutine.
func (fl *Follower) Stalled() time.Duration {
	if since := fl.reading.Load(); since != 0 {
		return time.Since(time.Unix(0, since))
	}
	return 0
}

// open opens the file at path to follow it, timed.
func (fl *Follower) open(path string) (file, error) {
	f, err := fl.hooks.open(path)
	if err != nil {
		return nil, err
	}
	return fl.timed(f), nil
}

// timed wraps a file the follower reads, for Stalled and the read count.
func (fl *Follower) timed(f file) file { return timedFile{f, &fl.reading, &fl.reads} }

// timedFile is a followed file whose reads and stats record when they
// began, for Stalled, and whose reads are counted. A read fills the
// decoder's buffer: this costs nothing per record.
type timedFile struct {
	file
	since *atomic.Int64
	reads *uint64 // the follower's goroutine only
}

func (f timedFile) ReadAt(p []byte, off int64) (int, error) {
	f.since.Store(time.Now().UnixNano())
	defer f.since.Store(0)
	*f.reads++
	return f.file.ReadAt(p, off)
}

func (f timedFile) Stat() (os.FileInfo, error) {
	f.since.Store(time.Now().UnixNano())
	defer f.since.Store(0)
	return f.file.Stat()
}

// readError is a failure to read the open file (an I/O error), as opposed
// to bytes that are not what they should be. It may pass: a live follower
// tries the same read again.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// retryable reports whether err is a read error that a live follower
// waits out; a replay fails with it.
func (fl *Follower) retryable(err error) bool {
	_, ok := errors.AsType[*readError](err)
	return ok && !fl.opts.Replay
}

// notStreamFile counts a file that is not a stream file as [EventFormat]
// when it is first seen, logs it (at once, then at most every 10 s) and
// waits as at the end of the data: someone may have copied the wrong file
// over the path, and the follower goes on by itself when it is replaced
// by a stream file (read from its beginning) or rewritten with a header.
func (fl *Follower) notStreamFile(ctx context.Context, err error) error {
	if fl.headerTrouble.Failed(fl.log, "the file at the path is not a stream file; waiting for a stream file to replace it", err) {
		fl.obs.Event(EventFormat)
	}
	fl.troubled(err)
	return fl.idle(ctx, io.EOF)
}

// readFailed counts a read error as [EventUnreadable] when it begins, logs
// it (at once, then at most every 10 s while it lasts) and waits, as at the
// end of the data, before the read is tried again at the same offset:
// nothing is skipped, and the follower goes on by itself once the file can
// be read.
func (fl *Follower) readFailed(ctx context.Context, err error) error {
	if fl.readTrouble.Failed(fl.log, "cannot read the stream file; trying again at the same offset at each notification and poll",
		err, "offset", fl.pos()) {
		fl.obs.Event(EventUnreadable)
	}
	fl.troubled(err)
	return fl.wait(ctx)
}

// troubled tells the Observer of err, a trouble with the file that keeps
// the follower from reading on, unless it was told of the same last.
func (fl *Follower) troubled(err error) {
	if msg := err.Error(); msg != fl.told {
		fl.told = msg
		fl.obs.Trouble(err)
	}
}

// untroubled tells the Observer, after a trouble passed, that none lasts,
// if so. A trouble that still lasts is told again, with its own error, at
// its next try.
func (fl *Follower) untroubled() {
	if fl.told != "" && !fl.readTrouble.Failing() && !fl.headerTrouble.Failing() && !fl.replace.openTrouble.Failing() {
		fl.told = ""
		fl.obs.Trouble(nil)
	}
}

// passed ends trouble t, which lasts: logged with msg and attrs, and told
// to the Observer as over.
func (fl *Follower) passed(t *ratelog.Trouble, msg string, attrs ...any) {
	t.Passed(fl.log, msg, attrs...)
	fl.untroubled()
}

// deliver decides about a record that is the end of stream, or that comes
// while frames are passed over until one reaches the seek target.
func (fl *Follower) deliver(rec *streamfile.Record) bool {
	if rec.IsEOS() {
		fl.err = io.EOF
		fl.log.Info("end of stream", "offset", rec.Offset)
		return true
	}
	if !reached(fl.pending, rec) {
		return false
	}
	fl.pending = nil
	fl.log.Info(msgStartReached, "offset", rec.Offset, "seq", rec.Seq)
	return true
}

// fail makes err the answer to every later call of Next.
func (fl *Follower) fail(err error) error {
	fl.err = err
	fl.report()
	return err
}

// idle handles the end of the available data, where the decoder said err
// (io.EOF, or ErrTruncated inside a frame): a replay finishes, a file that
// was replaced is left for the new one, and otherwise the follower waits.
// It returns nil when Next should read again.
func (fl *Follower) idle(ctx context.Context, err error) error {
	if r := &fl.replace; r.draining {
		grew, lerr := fl.grewUnderLock(ctx)
		if lerr != nil {
			return lerr
		}
		if grew {
			r.grew = time.Now()
			return nil // read what a writer finished before the lock
		}
		if left := fl.opts.RotationGrace - time.Since(r.grew); left > 0 {
			return fl.waitAtMost(ctx, left) // a producer may still write to it
		}
		return fl.switchFile(err)
	}
	if errors.Is(err, streamfile.ErrTruncated) {
		if skipped, err := fl.pastDamagedSize(ctx); err != nil || skipped {
			return err
		}
		if !fl.opts.Replay {
			fl.tornTail()
		}
	} else if !fl.torn.since.IsZero() {
		fl.tornPassed()
	}
	if fl.opts.Replay {
		if at := fl.pos(); errors.Is(err, streamfile.ErrTruncated) && fl.damage.replayRecheckAt != at {
			// A writer may be in the middle of appending the frame (the
			// replay's own copies, while it reads ahead): read it again
			// once no writer holds the file's lock.
			fl.damage.replayRecheckAt = at
			ok, err := fl.underSharedLock(ctx, nil)
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
		}
		if errors.Is(err, streamfile.ErrTruncated) {
			return fl.fail(fmt.Errorf("tail: %s: file of %d bytes ends inside the frame at offset %d: %w", fl.path, fl.size(), fl.pos(), err))
		}
		fl.log.Debug("replay finished", "offset", fl.pos())
		fl.replayEnd = true
		return fl.fail(io.EOF)
	}
	return fl.wait(ctx)
}

// pos returns the read position: where the next frame starts, or the
// damaged bytes being skipped; 0 before the header is read.
func (fl *Follower) pos() int64 {
	switch {
	case fl.dec != nil:
		return fl.dec.Pos()
	case fl.damage.skipAt >= 0:
		return fl.damage.skipAt
	}
	return 0
}

// size returns the size of the open file, or -1.
func (fl *Follower) size() int64 {
	fi, err := fl.f.Stat()
	if err != nil {
		return -1
	}
	return fi.Size()
}

// startOver drops the header and decoder of the open file, so that Next
// reads it again from its header, from its beginning: the start position
// applies to the first file only.
func (fl *Follower) startOver() {
	if fl.pending != nil {
		fl.log.Info(msgStartDropped, "start_at", fl.opts.Start.String())
	}
	fl.dec, fl.hdr, fl.pending, fl.last = nil, streamfile.Header{}, nil, lastRecord{}
	fl.damage.forget()
	fl.torn = tornState{} // left with the file: a replacement or truncation says what became of it
}

// prepare gets the decoder ready: it reads the header of a new file and
// applies the start position, or finds the next frame after damaged bytes.
// It reports false when it has to wait for more data.
func (fl *Follower) prepare() (bool, error) {
	if fl.damage.skipAt < 0 {
		return fl.readHeader()
	}
	return fl.skipDamaged()
}

// readHeader reads the header of the open file, sets its identity, and
// creates the decoder at the start position (the beginning, for every file
// after the first). It reports false while the header is incomplete.
func (fl *Follower) readHeader() (bool, error) {
	n, err := fl.f.ReadAt(fl.rawHdr[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, &readError{fmt.Errorf("tail: %s: read header: %w", fl.path, err)}
	}
	h, err := streamfile.ParseHeader(fl.rawHdr[:n])
	if errors.Is(err, streamfile.ErrTruncated) {
		if fl.opts.Replay {
			return false, fmt.Errorf("tail: %s: file of %d bytes ends inside the %d-byte header: %w", fl.path, n, streamfile.HeaderSize, err)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("tail: %w", &streamfile.HeaderError{Path: fl.path, Err: err})
	}
	fi, err := fl.f.Stat()
	if err != nil {
		return false, &readError{fmt.Errorf("tail: %w", err)}
	}
	id, err := streamfile.IdentityOf(fi, h)
	if err != nil {
		return false, fmt.Errorf("tail: %w", err)
	}
	fl.hdr = h
	fl.id = id
	fl.rec.File = fl.id
	fl.lastSize = fi.Size()
	off := int64(streamfile.HeaderSize)
	fl.pending = nil
	if !fl.started {
		fl.started = true
		if off, err = fl.startOffset(fi.Size()); err != nil {
			return false, err
		}
	} else if left, copied, ok := fl.replace.takeBack(id, fi); ok {
		off = fl.backAt(left, fi.Size(), copied)
	}
	fl.dec = streamfile.NewDecoder(fl.f, h, off)
	fl.reportPos, fl.damage.goodEnd = off, off
	fl.log.Debug("reading", "file_name", h.FileName, "created_at_ms", h.CreatedAtMs, "ino", id.Ino, "offset", off)
	return true, nil
}

// startOffset applies Options.Resume or Options.Start to the first file.
func (fl *Follower) startOffset(size int64) (int64, error) {
	if r := fl.opts.Resume; r != nil {
		if r.File != fl.id {
			// The file the position names was replaced at the path and
			// is not in the directory any more (compressed after a
			// rotation while streamd was stopped, say): what it held
			// after the position is not read.
			fl.log.Error("the file of the stored position is neither at the path nor in its directory (removed, compressed or moved away since the position was stored): "+
				"reading the file at the path from the beginning; the records of the other after the stored offset are not delivered "+
				"(find it by its inode or its header's file name and creation time, and read them with streamd decode)",
				"stored_offset", r.Offset, "stored_ino", r.File.Ino, "stored_file_name", r.File.FileName, "stored_created_at_ms", r.File.CreatedAtMs,
				"ino", fl.id.Ino, "file_name", fl.id.FileName, "created_at_ms", fl.id.CreatedAtMs)
			fl.obs.Event(EventReplaced)
			fl.obs.Event(EventLost)
			return streamfile.HeaderSize, nil
		}
		if err := checkBoundary(fl.f, fl.hdr, size, r.Offset); err != nil {
			fl.log.Warn("stored position does not fit the file, which was truncated or rewritten; reading it from the beginning",
				"offset", r.Offset, "size", size, "err", err)
			fl.obs.Event(EventTruncated)
			return streamfile.HeaderSize, nil
		}
		return r.Offset, nil
	}
	off, pending, err := fl.opts.Start.resolve(fl.f, fl.hdr, size, fl.opts.Key)
	if err != nil {
		return 0, fmt.Errorf("tail: %s: start position %s: %w", fl.path, fl.opts.Start, err)
	}
	fl.pending = pending
	switch {
	case pending != nil && fl.opts.Replay:
		fl.log.Warn(msgStartNotReachedReplay, "start_at", fl.opts.Start.String(), "key", fl.opts.Key)
	case pending != nil:
		fl.log.Warn(msgStartNotReached, "start_at", fl.opts.Start.String(), "key", fl.opts.Key)
	}
	return off, nil
}

// backAt returns where to read a file the follower left (left) and finds
// at the path again, size bytes long, or a copy of it (copied): left.offset,
// or its beginning when the last record read of it does not read the same
// any more, or the offset does not fit the file: it was truncated or
// rewritten meanwhile (for a copy: it is another file, or a shorter copy).
func (fl *Follower) backAt(left leftFile, size int64, copied bool) int64 {
	off := left.offset
	d := streamfile.NewDecoder(fl.f, fl.hdr, left.last.offset)
	rec, err := d.Next()
	switch {
	case err != nil:
	case lastRecordOf(rec) != left.last:
		err = fmt.Errorf("the record at offset %d is not the one read there", left.last.offset)
	case off != left.last.end:
		err = checkBoundary(fl.f, fl.hdr, size, off)
	}
	switch {
	case err != nil && copied:
		return streamfile.HeaderSize // another file with the same header, as a new file is read
	case err != nil:
		fl.log.Warn("the stream file read before is back at the path, but rewritten or truncated since; reading it from the beginning",
			"offset", off, "size", size, "err", err)
		fl.obs.Event(EventTruncated)
		return streamfile.HeaderSize
	case copied:
		fl.log.Info("the file at the path is a copy of the stream file read before (the same header and records, another inode); reading it on from where the other was left",
			"offset", off, "ino", fl.id.Ino, "old_ino", left.id.Ino, "file_name", fl.id.FileName, "created_at_ms", fl.id.CreatedAtMs)
	default:
		fl.log.Info("the stream file read before is back at the path; reading it on from where it was left",
			"offset", off, "ino", fl.id.Ino, "file_name", fl.id.FileName, "created_at_ms", fl.id.CreatedAtMs)
	}
	return off
}

// msgStartNotReached and msgStartReached are logged when no record of the
// file reaches a seq: or time: start yet, and when one does;
// msgStartNotReachedReplay, in a replay, which ends at the end of the
// data; msgStartDropped, when the file is replaced or truncated before one
// does.
const (
	msgStartNotReached       = "no record of the key reaches start_at in the file yet: the records written are passed over until one does"
	msgStartNotReachedReplay = "no record of the key reaches start_at in the file: the replay ends without delivering any, unless one written before its end does"
	msgStartReached          = "a record reaches start_at: reading starts with it"
	msgStartDropped          = "the file was replaced or truncated before a record reached start_at, which applies to the first file only: what is at the path is read from its beginning"
)

// report tells the Observer what was read since the last report.
func (fl *Follower) report() {
	pos := fl.pos()
	bytes := max(pos-fl.reportPos, 0)
	fl.reportPos = pos
	if fl.records == 0 && bytes == 0 {
		return
	}
	fl.obs.Read(fl.records, bytes)
	fl.records = 0
}

// Hold returns a descriptor of its own for the file the follower reads, which
// stays open once the follower left the file or was closed: for
// [Options.Held]. It is nil when the file cannot be duplicated (out of
// descriptors), which only loses that hand-over. Call it from the goroutine
// that calls Next.
func (fl *Follower) Hold() *os.File { return dupFile(fl.f) }

// dupFile returns a descriptor of its own for the file f reads; nil when f
// is not an *os.File or cannot be duplicated.
func dupFile(ff file) *os.File {
	if tf, ok := ff.(timedFile); ok {
		ff = tf.file
	}
	f, ok := ff.(*os.File)
	if !ok {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	nfd := -1
	if cerr := rc.Control(func(fd uintptr) {
		nfd, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); cerr != nil || err != nil {
		return nil
	}
	return os.NewFile(uintptr(nfd), f.Name())
}

// HoldAhead returns descriptors of their own, in the order they would be
// read, for the file the follower reads and the files it keeps open to
// read after it (seen at the path while it reads the open one to its
// end): for [Options.HeldAfter], beside the file of the position held
// (Hold). Those that cannot be duplicated (out of descriptors) are left
// out, which only loses their hand-over. Call it from the goroutine that
// calls Next.
func (fl *Follower) HoldAhead() []*os.File {
	var fs []*os.File
	if f := fl.Hold(); f != nil {
		fs = append(fs, f)
	}
	for _, s := range fl.replace.seen {
		if f := dupFile(s.f); f != nil {
			fs = append(fs, f)
		}
	}
	return fs
}

// Close stops watching and closes the file. It returns nil when called
// again.
func (fl *Follower) Close() error {
	if fl.err == ErrClosed {
		return nil
	}
	fl.report()
	fl.sayLeftOut(fl.damage.logLimit.Drain())
	fl.err = ErrClosed
	var err error
	if fl.watch != nil {
		fl.watch.leave()
	}
	fl.dropLink()
	if fl.ownWatcher != nil {
		err = fl.ownWatcher.Close()
	}
	if fl.timer != nil {
		fl.timer.Stop()
	}
	fl.forgetSeen()
	return errors.Join(err, fl.f.Close())
}
