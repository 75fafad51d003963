package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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

	mu    sync.Mutex
	a     *streamfile.Appender
	dirty bool // appended since the last sync
	wrote bool // appended to since it was opened
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
	if err := s.a.Publish(f); err != nil {
		return fmt.Errorf("stream %q: %w", s.cfg.Name, err)
	}
	s.dirty, s.wrote = true, true
	return nil
}

// sync makes the appended copies durable; a commit that moves a position
// past a copy calls it first (Invariant 2).
func (s *stream) sync() error {
	s.mu.Lock()
	dirty, w := s.dirty, s.a.Writer()
	s.dirty = false
	s.mu.Unlock()
	if !dirty {
		return nil
	}
	if err := w.Sync(); err != nil {
		s.mu.Lock()
		swapped := s.a.Writer() != w
		if !swapped {
			s.dirty = true
		}
		s.mu.Unlock()
		if swapped {
			return nil // the appender synced w before it closed it
		}
		return fmt.Errorf("stream %q: %w", s.cfg.Name, err)
	}
	return nil
}

// close syncs the file if this daemon appended to it (a file it only read
// is not flushed: that is its writer's business), and closes the writer.
func (s *stream) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.wrote {
		// Even when not dirty: a sync running alongside may have taken the
		// flag and not be done yet.
		err = s.a.Sync()
	}
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
