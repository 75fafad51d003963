package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
// writer is shared by the subscriptions of the stream and by the retry
// queue, so appends are serialised here; each append also takes the file's
// flock inside the writer.
type stream struct {
	cfg conf.Stream

	mu    sync.Mutex
	w     *streamfile.Writer
	dirty bool // appended since the last sync
	wrote bool // appended to since it was opened
}

// openStream opens (and, with create, makes) the stream file. A file of at
// most 128 bytes gets the reference runtime's priming record, so that files
// stay interchangeable with it (settlement.md §7.2, checklist 31).
func openStream(cfg conf.Stream) (*stream, error) {
	if !cfg.Create {
		if _, err := os.Stat(cfg.Path); err != nil {
			return nil, fmt.Errorf("stream %q: %w (create = false: the file must exist)", cfg.Name, err)
		}
	}
	w, err := streamfile.OpenWriter(cfg.Path, streamfile.CreateOptions{
		Create:         cfg.Create,
		RefuseReplaced: true,
		Header: streamfile.Header{
			FileName:       truncateName(filepath.Base(cfg.Path)),
			CreatedAtMs:    uint64(time.Now().UnixMilli()),
			BeaconInterval: uint32(cfg.BeaconInterval),
		},
	})
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("stream %q: %w (streamd reads the file and appends retry copies to it: its user needs read and write access)", cfg.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %q: %w", cfg.Name, err)
	}
	fi, err := w.Stat()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("stream %q: %w", cfg.Name, err), w.Close())
	}
	s := &stream{cfg: cfg, w: w}
	if fi.Size() <= streamfile.HeaderSize+7 { // a header, and the empty beacon of a 128-byte interval
		if err := s.append(reservedKey, []byte("1")); err != nil {
			return nil, errors.Join(err, w.Close())
		}
	}
	return s, nil
}

// truncateName shortens a file name to what the header can hold.
func truncateName(name string) string {
	if len(name) > streamfile.MaxFileNameLen {
		return name[:streamfile.MaxFileNameLen]
	}
	return name
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
	err := s.w.Publish(f)
	if errors.Is(err, streamfile.ErrReplaced) {
		if err = s.follow(); err == nil {
			err = s.w.Publish(f)
		}
	}
	if err != nil {
		return fmt.Errorf("stream %q: %w", s.cfg.Name, err)
	}
	s.dirty, s.wrote = true, true
	return nil
}

// follow points the writer at the file now at the path, after a batch
// found that another one was renamed over it, or it was deleted and created
// again (streamfile.ErrReplaced, checked under the file's lock): copies
// must go where the subscriptions read (they leave the old file for the new
// one, reading the old one a last time under a shared lock), not into a
// file nobody reads again. A new file that cannot be opened for appending
// is an error, so the copy fails and its record stays unsettled until it
// can. The old file is synced before it is closed, so the copies in it are
// durable before a commit passes them (Invariant 2). It is called with mu
// held.
func (s *stream) follow() error {
	w, err := streamfile.OpenWriter(s.cfg.Path, streamfile.CreateOptions{RefuseReplaced: true})
	if err != nil {
		return fmt.Errorf("the file was replaced, and the new one cannot be opened for appending copies: %w", err)
	}
	if err := s.w.Sync(); err != nil {
		return errors.Join(fmt.Errorf("sync the replaced file: %w", err), w.Close())
	}
	s.w.Close()
	s.w = w
	return nil
}

// sync makes the appended copies durable; a commit that moves a position
// past a copy calls it first (Invariant 2).
func (s *stream) sync() error {
	s.mu.Lock()
	dirty, w := s.dirty, s.w
	s.dirty = false
	s.mu.Unlock()
	if !dirty {
		return nil
	}
	if err := w.Sync(); err != nil {
		s.mu.Lock()
		swapped := s.w != w
		if !swapped {
			s.dirty = true
		}
		s.mu.Unlock()
		if swapped {
			return nil // follow synced w before it closed it
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
		err = s.w.Sync()
	}
	return errors.Join(err, s.w.Close())
}

// fileCopies publishes a file subscription's copies into its stream: now,
// or through the durable retry queue.
type fileCopies struct {
	stream *stream
	queue  *retrytimer.Queue
}

func (c fileCopies) publish(_ context.Context, key string, record []byte) error {
	return c.stream.append(key, record)
}

func (c fileCopies) schedule(key string, record []byte, due time.Time) error {
	return c.queue.Schedule(retrytimer.Copy{Stream: c.stream.cfg.Name, Key: key, Payload: record}, due)
}
