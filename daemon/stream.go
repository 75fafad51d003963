package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/retrytimer"
	"github.com/streamd/streamd/streamfile"
)

// reservedKey is the stream key of the reference runtime's priming record;
// it is never delivered (settlement.md §7.2).
const reservedKey = "ruststream-internal"

// stream is one configured stream file, opened for appending copies. Its
// appender is shared by the subscriptions of the stream and by the retry
// queue, so appends are serialised here; each append also takes the file's
// flock inside the writer.
//
// Copies go to the file at the path, which the subscriptions read: when
// another file is renamed over it, or it is deleted and created again, the
// appender moves to the new file (the subscriptions leave the old one for
// it, after a last read under a shared lock) and syncs the old one before
// closing it, so the copies in it are durable before a commit passes them
// (Invariant 2). A new file that cannot be opened for appending fails the
// copy, and its record stays unsettled until it can.
type stream struct {
	cfg conf.Stream

	mu       sync.Mutex
	a        *streamfile.Appender
	appended uint64 // copies appended since the stream was opened
	closed   bool   // close began: no more appends

	// syncMu makes one fsync at a time, and a caller that comes during
	// one wait for it: a copy is durable only once an fsync that began
	// after its append succeeded. synced is appended as the last such
	// fsync found it.
	syncMu sync.Mutex
	synced uint64
}

// self is the account of this process, which checkStream judges.
var self = sync.OnceValue(currentAccount)

// openStream opens (and, with create, makes) the stream file. A file of at
// most 128 bytes gets the reference runtime's priming record, so that files
// stay interchangeable with it (settlement.md §7.2, checklist 31).
func openStream(cfg conf.Stream, logger *slog.Logger) (*stream, error) {
	if err := checkStream(cfg, self()); err != nil {
		return nil, err
	}
	a, err := streamfile.OpenAppender(cfg.Path, streamfile.AppendOptions{Create: cfg.Create, BeaconInterval: uint32(cfg.BeaconInterval), Mode: fs.FileMode(cfg.FileMode), Log: logger})
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("stream %q: %w (streamd reads the file and appends retry copies to it: its user needs read and write access)", cfg.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %q: %w", cfg.Name, err)
	}
	fi, err := a.Writer().Stat()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("stream %q: %w", cfg.Name, err), a.Close())
	}
	s := &stream{cfg: cfg, a: a}
	if fi.Size() <= streamfile.HeaderSize+7 { // a header, and the empty beacon of a 128-byte interval
		if err := s.append(reservedKey, []byte("1")); err != nil {
			return nil, errors.Join(err, a.Close())
		}
	}
	return s, nil
}

// append writes record, in its final form, under key with the next
// sequence of the key.
func (s *stream) append(key string, record []byte) error {
	f := []streamfile.Frame{{
		Key:         key,
		TimestampMs: uint64(time.Now().UnixMilli()),
		Payload:     record,
	}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("stream %q: closed (a reload removed it)", s.cfg.Name)
	}
	if err := s.a.Publish(f); err != nil {
		return fmt.Errorf("stream %q: %w", s.cfg.Name, err)
	}
	s.appended++
	return nil
}

// followPath moves the appender to the file now at the path when another
// file took it (streamfile.Appender.FollowPath), so that the rotated file
// is closed without waiting for the next copy. Failing, it stays: the next
// copy tries again, and says why.
func (s *stream) followPath() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.a.FollowPath()
	}
}

// sync makes the copies appended before it was called durable; a commit
// that moves a position past a copy, and the retry queue before it marks
// a copy written, call it first (Invariant 2). Once an fsync failed, it
// fails for good (streamfile.Writer.Sync): the copies since the last good
// one may be lost, and only a restart, which reads their records again
// from the last commit, makes them anew.
func (s *stream) sync() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	target, w := s.appended, s.a.Writer()
	s.mu.Unlock()
	if s.synced >= target {
		return nil
	}
	if err := w.Sync(); err != nil {
		s.mu.Lock()
		swapped := s.a.Writer() != w
		s.mu.Unlock()
		if !swapped || !errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("stream %q: %w; the retry copies appended since the last fsync may be lost: streamd stops, and reads their records again from the last commit when it starts", s.cfg.Name, err)
		}
		// The appender synced w before it closed it for the file that
		// took the path: the copies counted in target are durable. (Any
		// other error is w's own: an fsync's error is reported once, to
		// one of the two.)
	}
	s.synced = target
	return nil
}

// close syncs the copies this daemon appended (a file it only read is not
// flushed: that is its writer's business), and closes the writer. No copy
// is appended after the sync: append fails once close began.
func (s *stream) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.sync()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(err, s.a.Close())
}

// fileCopies publishes a file subscription's copies into its stream: now,
// or through the durable retry queue.
type fileCopies struct {
	stream       *stream
	queue        *retrytimer.Queue
	subscription string // whose copies they are
}

func (c fileCopies) publish(_ context.Context, key string, record []byte) error {
	return c.stream.append(key, record)
}

func (c fileCopies) schedule(key string, record []byte, due time.Time) error {
	return c.queue.Schedule(retrytimer.Copy{Stream: c.stream.cfg.Name, Key: key, Record: record, Subscription: c.subscription}, due)
}
