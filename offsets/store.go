package offsets

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/streamd/streamd/streamfile"
)

// SidecarName is the name of the sidecar file in the state directory.
const SidecarName = "offsets.json"

// defaultInterval is the commit interval Run uses when given none.
const defaultInterval = time.Second

// Position is where a subscription resumes.
type Position struct {
	// Stream is the path of the stream file.
	Stream string
	// File identifies the file the offset belongs to.
	File streamfile.Identity
	// Offset is the byte offset of the next frame to read.
	Offset int64
	// LastSeq is the sequence number of the last settled record.
	LastSeq uint64
	// CommittedAt is when this position was last written to the sidecar.
	// Set ignores it; Commit stamps it.
	CommittedAt time.Time
}

// check reports what makes p unfit to be stored under name.
func (p Position) check(name string) error {
	switch {
	case name == "":
		return errors.New("empty subscription name")
	case !utf8.ValidString(name):
		return fmt.Errorf("subscription name %q is not valid UTF-8", name)
	case !utf8.ValidString(p.Stream):
		return fmt.Errorf("subscription %q: stream path %q is not valid UTF-8", name, p.Stream)
	case !utf8.ValidString(p.File.FileName):
		return fmt.Errorf("subscription %q: file name %q is not valid UTF-8", name, p.File.FileName)
	case p.Offset < 0:
		return fmt.Errorf("subscription %q: negative offset %d", name, p.Offset)
	}
	return nil
}

// Options are the hooks of a [Store]. The zero value has none.
type Options struct {
	// Sync, if not nil, is called by every commit that has positions to
	// write, after it has captured them and before it writes the sidecar.
	// It must make durable every record copy appended on behalf of the
	// records those positions pass, typically by fsyncing the stream files
	// that received appends since the previous call (Invariant 2: durable
	// before committed, one fsync per file per commit). An error aborts the
	// commit; the positions stay pending.
	Sync func() error
	// Observe, if not nil, is called after every commit that had positions
	// to write or failed, with its duration (Sync included) and its error,
	// and after the first one that passes after one that failed, also with
	// nothing to write (duration 0): the last call says whether commits
	// work. Other commits with nothing to write are not observed. The calls
	// come in the order of the commits, with no lock of the Store held but
	// one that orders them.
	Observe func(d time.Duration, err error)
	// Marker, if not empty, names a file of the state directory that the
	// caller creates after Open returns, and whose presence says the
	// directory has been used (the daemon's retry spool). If it exists and
	// the sidecar does not, the positions are lost (a sidecar deleted by
	// hand, a restore that left it out): Open fails with a [*MissingError]
	// rather than start every subscription afresh. If neither exists, Open
	// writes a sidecar with no positions before it returns, so that a
	// directory with the marker always has a sidecar.
	Marker string
	// AllowMissing takes a missing sidecar for an empty one even next to
	// the marker, which then only names itself in the advice of a
	// [*CorruptError]: for streamd offsets set, one way out of a lost
	// sidecar.
	AllowMissing bool
	// Logger, if not nil, gets what commits mend: a lock file or a sidecar
	// removed while the Store was open.
	Logger *slog.Logger
}

// Store holds the positions of all subscriptions of one state directory and
// commits them to its sidecar file. It holds the directory's lock from Open
// to Close.
//
// Its methods are safe for concurrent use. Commits are serialized; Get and
// Set never wait for a commit's disk I/O.
type Store struct {
	path string
	opts Options
	log  *slog.Logger

	// commitMu serializes Commit and Close, so that an older snapshot is
	// never renamed over a newer one and the lock outlives every write.
	commitMu sync.Mutex
	lock     *lockFile // nil once closed; guarded by commitMu
	written  bool      // the sidecar was there at Open or written since; guarded by commitMu
	failing  bool      // the last commit observed failed; guarded by commitMu
	// observeMu keeps the calls of Options.Observe in the order of their
	// commits, which Run and a subscription's start may make at once.
	observeMu sync.Mutex

	mu      sync.Mutex
	entries map[string]*entry // guarded by mu
	gen     uint64            // bumped by every Set that changes a position; guarded by mu
	saved   uint64            // gen as of the last successful commit; guarded by mu

	beat atomic.Int64 // Unix nanoseconds when Run last started or finished a commit
}

type entry struct {
	pos Position
	gen uint64 // Store.gen when pos last changed
}

// Open locks the state directory dir and loads its sidecar. A missing
// sidecar means a fresh start: no positions (but see [Options.Marker]). A
// corrupt one is a [*CorruptError] and the file is left as it is. If
// another process, or another Store in this process, holds the directory,
// Open fails at once with a [*LockedError]. Open does not create dir and
// starts no goroutines.
func Open(dir string, opts Options) (*Store, error) {
	lock, err := acquireLock(dir)
	if err != nil {
		return nil, err
	}
	positions, found, err := load(dir, opts.Marker)
	if err == nil && !found && opts.Marker != "" && !opts.AllowMissing {
		err = startFresh(dir, opts.Marker)
		found = err == nil
	}
	if err != nil {
		if relErr := lock.release(); relErr != nil {
			err = errors.Join(err, relErr)
		}
		return nil, err
	}
	s := &Store{
		path:    filepath.Join(dir, SidecarName),
		opts:    opts,
		log:     cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
		lock:    lock,
		written: found,
		entries: make(map[string]*entry, len(positions)),
	}
	for name, p := range positions {
		s.entries[name] = &entry{pos: p}
	}
	return s, nil
}

// Load reads the sidecar of the state directory dir without taking its
// lock, for reading positions while a daemon may be running. The sidecar is
// replaced by rename, so Load sees one whole commit. A missing sidecar gives
// an empty map; a corrupt one a [*CorruptError].
func Load(dir string) (map[string]Position, error) {
	positions, _, err := load(dir, "")
	return positions, err
}

// LoadMarked is [Load] for a state directory whose marker file is marker
// ([Options.Marker]), and refuses what [Open] with that marker refuses: a
// missing sidecar next to the marker is a [*MissingError], and a corrupt
// one a [*CorruptError] whose advice names the marker. Like Load, it
// takes no lock.
func LoadMarked(dir, marker string) (map[string]Position, error) {
	positions, found, err := load(dir, marker)
	if err == nil && !found {
		err = checkMarker(dir, marker)
	}
	if err != nil {
		return nil, err
	}
	return positions, nil
}

// load is Load, and reports whether the sidecar exists. A [*CorruptError]
// names the marker file, if marker is set and the file may exist.
func load(dir, marker string) (map[string]Position, bool, error) {
	path := filepath.Join(dir, SidecarName)
	data, err := readSidecar(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]Position{}, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("offsets: read sidecar: %w", err)
	}
	positions, err := decode(data)
	if err != nil {
		ce := &CorruptError{Path: path, Err: err}
		if marker != "" {
			m := filepath.Join(dir, marker)
			if _, err := os.Lstat(m); !errors.Is(err, fs.ErrNotExist) {
				ce.Marker = m
			}
		}
		return nil, true, ce
	}
	return positions, true, nil
}

// checkMarker returns a [*MissingError] if the marker file exists in the
// state directory dir, whose sidecar is missing.
func checkMarker(dir, marker string) error {
	m := filepath.Join(dir, marker)
	_, err := os.Lstat(m)
	switch {
	case err == nil:
		return &MissingError{Path: filepath.Join(dir, SidecarName), Marker: m}
	case errors.Is(err, fs.ErrNotExist):
		return nil
	}
	return fmt.Errorf("offsets: %w", err)
}

// startFresh is Open's first start in the state directory dir, which has
// no sidecar: a [*MissingError] if the marker shows the directory was used,
// and otherwise an empty sidecar, written before the caller creates the
// marker.
func startFresh(dir, marker string) error {
	if err := checkMarker(dir, marker); err != nil {
		return err
	}
	data, err := encode(nil)
	if err == nil {
		err = writeAtomically(filepath.Join(dir, SidecarName), data)
	}
	if err != nil {
		return fmt.Errorf("offsets: write the first sidecar: %w", err)
	}
	return nil
}

// Get returns the position of the subscription name and whether it has one.
func (s *Store) Get(name string) (Position, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[name]
	if !ok {
		return Position{}, false
	}
	return e.pos, true
}

// Set records p as the position of the subscription name, in memory; the
// next Commit writes it. p.CommittedAt is ignored. Setting the position a
// subscription already has changes nothing. Set fails, changing nothing, on
// an empty name, a negative offset or a string that is not valid UTF-8
// (JSON could not store it as it is).
func (s *Store) Set(name string, p Position) error {
	if s.advance(name, p) {
		return nil
	}
	if err := p.check(name); err != nil {
		return fmt.Errorf("offsets: set: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[name]
	if !ok {
		e = &entry{}
		s.entries[name] = e
	}
	s.update(e, p)
	return nil
}

// advance is Set for the common case, a subscription that moves on in the
// file of its stored position, whose strings were checked when it was set:
// it reports false, changing nothing, for any other case.
func (s *Store) advance(name string, p Position) bool {
	s.mu.Lock()
	e, ok := s.entries[name]
	ok = ok && e.pos.Stream == p.Stream && e.pos.File == p.File && p.Offset >= 0
	if ok && (e.pos.Offset != p.Offset || e.pos.LastSeq != p.LastSeq) {
		s.update(e, p)
	}
	s.mu.Unlock()
	return ok
}

// update makes p the position of e, keeping when e was committed.
func (s *Store) update(e *entry, p Position) {
	committedAt := e.pos.CommittedAt
	e.pos = p
	e.pos.CommittedAt = committedAt
	s.gen++
	e.gen = s.gen
}

// Commit writes the positions to the sidecar, atomically and durably, if
// any changed since the last successful commit; otherwise it writes
// nothing. It captures the positions, calls [Options.Sync], writes a
// temporary file in the state directory, fsyncs and closes it, renames it
// over the sidecar and fsyncs the directory. On error the sidecar is
// unchanged, the temporary file is removed and the positions stay pending
// for the next commit. Commit stamps CommittedAt on the positions it wrote.
func (s *Store) Commit() error {
	s.observeMu.Lock()
	defer s.observeMu.Unlock()
	d, wrote, err := s.commit()
	if wrote && s.opts.Observe != nil {
		s.opts.Observe(d, err)
	}
	return err
}

// commit does the work of Commit and reports how long it took and whether
// Commit observes it: one that had anything to write, failed, or was the
// first to pass after one that failed.
func (s *Store) commit() (time.Duration, bool, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	d, wrote, err := s.commitLocked()
	if !wrote && s.failing {
		wrote = true // the trouble passed, which Observe must learn
	}
	if wrote {
		s.failing = err != nil
	}
	return d, wrote, err
}

// commitLocked does the work of commit, with commitMu held, and reports
// whether it had anything to write or failed.
func (s *Store) commitLocked() (time.Duration, bool, error) {
	if s.lock == nil {
		return 0, false, errors.New("offsets: commit: store is closed")
	}
	// At every commit, also one with nothing to write: the lock file and
	// the sidecar stay where they must be.
	if remade, err := s.lock.reclaim(); err != nil {
		return 0, true, err // another streamd may use the directory: commit nothing
	} else if remade {
		s.log.Warn(msgLockRemade, "path", s.lock.path)
	}
	s.lock.writeMissingPID()
	_, err := os.Lstat(s.path)
	gone := s.written && errors.Is(err, fs.ErrNotExist)

	s.mu.Lock()
	if s.gen == s.saved && !gone {
		s.mu.Unlock()
		return 0, false, nil
	}
	gen, saved := s.gen, s.saved
	now := time.Now().UTC().Round(0)
	snapshot := make(map[string]Position, len(s.entries))
	for name, e := range s.entries {
		p := e.pos
		if e.gen > saved {
			p.CommittedAt = now
		}
		snapshot[name] = p
	}
	s.mu.Unlock()

	start := time.Now()
	err = s.write(snapshot)
	d := time.Since(start)
	if err != nil {
		return d, true, err
	}
	if gone {
		s.log.Warn(msgSidecarRemade, "path", s.path)
	}
	s.written = true

	s.mu.Lock()
	for _, e := range s.entries {
		if e.gen > saved && e.gen <= gen {
			e.pos.CommittedAt = now
		}
	}
	s.saved = gen
	s.mu.Unlock()
	return d, true, nil
}

// msgLockRemade and msgSidecarRemade are logged when a commit finds the
// lock file or the sidecar removed while the Store was open.
const (
	msgLockRemade    = "the lock file of the state directory was removed while streamd ran; it is made again, so that no other streamd takes the directory"
	msgSidecarRemade = "the sidecar was removed while streamd ran; it is written again"
)

// write makes snapshot the content of the sidecar.
func (s *Store) write(snapshot map[string]Position) error {
	if s.opts.Sync != nil {
		if err := s.opts.Sync(); err != nil {
			return fmt.Errorf("offsets: commit: sync streams: %w", err)
		}
	}
	data, err := encode(snapshot)
	if err != nil {
		return fmt.Errorf("offsets: commit: %w", err)
	}
	if err := writeAtomically(s.path, data); err != nil {
		return fmt.Errorf("offsets: commit: %w", err)
	}
	return nil
}

// Run commits every interval (one second if interval is not positive) until
// ctx ends, then commits once more and returns that commit's error. A
// failed periodic commit is reported to [Options.Observe] and retried at
// the next tick: the positions stay pending and the sidecar keeps the last
// good commit. Run blocks; the caller runs it in a goroutine of its own and
// cancels ctx only once the records it wants committed are settled.
func (s *Store) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = defaultInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	s.beat.Store(time.Now().UnixNano())
	for {
		select {
		case <-ctx.Done():
			return s.Commit()
		case <-ticker.C:
			// Observe reports the error and the next tick retries, so the
			// loop goes on: a transient ENOSPC must not stop the daemon.
			_ = s.Commit()
			s.beat.Store(time.Now().UnixNano())
		}
	}
}

// LastBeat returns when Run last started or finished a commit, failed or
// not: a commit loop whose last beat is long past is stuck (a hung fsync),
// which the systemd watchdog must learn. It is the zero time before Run.
func (s *Store) LastBeat() time.Time {
	if n := s.beat.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Close releases the state directory's lock, after any commit under way. It
// does not commit: call Commit first. Commit fails after Close; Get and Set
// still work on the memory copy.
func (s *Store) Close() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if s.lock == nil {
		return errors.New("offsets: close: store is already closed")
	}
	err := s.lock.release()
	s.lock = nil
	return err
}
