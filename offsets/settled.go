package offsets

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/streamfile"
)

// SettledName is the file in the state directory that keeps, from a
// graceful stop to the next start, the records each subscription settled
// beyond its stored position ([Settled]).
const SettledName = "settled.json"

// settledVersion is the format of the settled file this package writes and
// reads.
const settledVersion = 1

// maxSettledRecords bounds the records kept for one subscription: the
// first ones after its position, which a start reads first. A subscription
// with batches may have settled far more (its window is larger); the rest
// are delivered again. Together with maxSidecarSize, which bounds the file,
// it keeps a file to a size its next start reads back.
const maxSettledRecords = 1 << 14

// Settled is what a subscription settled beyond its stored position:
// records behind one whose outcome was not final (a held record, or one
// in flight), which a start at that position reads again. A subscription
// that starts at Offset of File, in Stream, choosing records as Key and
// RenamedFrom chose them, need not deliver them again.
type Settled struct {
	// Stream is the path of the stream file.
	Stream string
	// File identifies the file the records are in.
	File streamfile.Identity
	// Offset is the position the records lie beyond.
	Offset int64
	// CommittedAt is when that position was committed
	// ([Position.CommittedAt]): a position committed since (set by hand,
	// by a streamd that does not know the file, or restored from a
	// backup) is another, even at the same offset. Zero for a reload's
	// handover, within one process.
	CommittedAt time.Time
	// Key and RenamedFrom are the subscription's configuration that chose
	// the records: its stream key, and the former names whose retry copies
	// were its own. A subscription configured otherwise wants other
	// records.
	Key         string
	RenamedFrom []string
	// Records are the settled records, in file order; a record is told
	// from another written at the same offsets by its sequence number and
	// tag.
	Records []Span
}

// The JSON shape of the settled file. A record is [start, end, seq, tag].
type (
	settledFileJSON struct {
		Version       int                    `json:"version"`
		Subscriptions map[string]settledJSON `json:"subscriptions"`
	}
	settledJSON struct {
		Stream      string       `json:"stream"`
		File        identityJSON `json:"file"`
		Offset      int64        `json:"offset"`
		CommittedAt string       `json:"committed_at"`
		Key         string       `json:"key"`
		RenamedFrom []string     `json:"renamed_from"`
		Records     [][4]uint64  `json:"records"`
	}
)

// SaveSettled keeps settled, by subscription name, in the settled file of
// the state directory until [Store.TakeSettled], atomically and durably,
// after [Options.Sync] (the copies of the records it names must outlive a
// crash that keeps the file). It keeps at most maxSettledRecords records of
// a subscription. An empty settled removes the file; one too large for
// TakeSettled to read back is not written.
func (s *Store) SaveSettled(settled map[string]Settled) error {
	path := s.settledPath()
	settled = maps.Clone(settled)
	maps.DeleteFunc(settled, func(_ string, st Settled) bool { return len(st.Records) == 0 })
	if len(settled) == 0 {
		return removeSettled(path)
	}
	if s.opts.Sync != nil {
		if err := s.opts.Sync(); err != nil {
			return fmt.Errorf("offsets: keeping the settled records: sync streams: %w", err)
		}
	}
	data, err := encodeSettled(settled)
	if err != nil {
		return fmt.Errorf("offsets: keeping the settled records: %w", err)
	}
	if _, err := durable.Replace(path, sidecarMode, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	}, nil); err != nil {
		return fmt.Errorf("offsets: keeping the settled records: %w", err)
	}
	return nil
}

// TakeSettled returns what [Store.SaveSettled] kept, and removes the file:
// it holds for the start that follows the stop that wrote it. A missing
// file is none. A file that cannot be read, or is not a settled file, is
// removed too, and its error returned: at worst, its records are delivered
// again.
func (s *Store) TakeSettled() (map[string]Settled, error) {
	path := s.settledPath()
	settled, err := readSettled(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return settled, errors.Join(err, removeSettled(path))
}

// ForgetSettled drops what the settled file keeps for the subscription
// name, durably: a position set by hand delivers every record from there.
// A settled file that cannot be read is removed: at worst, the records it
// kept for other subscriptions are delivered again.
func (s *Store) ForgetSettled(name string) error {
	settled, err := readSettled(s.settledPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		settled = nil
	}
	delete(settled, name)
	return s.SaveSettled(settled)
}

// readSettled reads and decodes the settled file at path.
func readSettled(path string) (map[string]Settled, error) {
	data, err := readSidecar(path)
	if err != nil {
		return nil, err
	}
	settled, err := decodeSettled(data)
	if err != nil {
		return nil, fmt.Errorf("offsets: settled file %s: %w", path, err)
	}
	return settled, nil
}

func (s *Store) settledPath() string { return filepath.Join(filepath.Dir(s.path), SettledName) }

// removeSettled removes the settled file at path, if there is one,
// durably: a file back after a power loss would skip records again.
func removeSettled(path string) error {
	err := os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = durable.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("offsets: removing the settled file: %w", err)
	}
	return nil
}

// encodeSettled returns the settled file holding settled, at most
// maxSettledRecords records of each subscription, or an error if it would
// be too large to read back.
func encodeSettled(settled map[string]Settled) ([]byte, error) {
	file := settledFileJSON{Version: settledVersion, Subscriptions: make(map[string]settledJSON, len(settled))}
	for name, st := range settled {
		records := make([][4]uint64, min(len(st.Records), maxSettledRecords))
		for i := range records {
			r := st.Records[i]
			records[i] = [4]uint64{uint64(r.Start), uint64(r.End), r.Seq, r.Tag}
		}
		file.Subscriptions[name] = settledJSON{
			Stream:      st.Stream,
			File:        identityJSONOf(st.File),
			Offset:      st.Offset,
			CommittedAt: st.CommittedAt.UTC().Format(time.RFC3339Nano),
			Key:         st.Key,
			RenamedFrom: orEmpty(st.RenamedFrom),
			Records:     records,
		}
	}
	data, err := json.Marshal(file)
	if err != nil {
		return nil, err
	}
	if len(data) >= maxSidecarSize {
		return nil, fmt.Errorf("%d bytes, more than the %d a start reads back", len(data)+1, maxSidecarSize)
	}
	return append(data, '\n'), nil
}

// orEmpty returns names, or an empty list for none, so that the file
// holds [] rather than null.
func orEmpty(names []string) []string {
	if names == nil {
		return []string{}
	}
	return names
}

// settledShape is the keys of a settled file.
var settledShape = shape{
	entry: []string{"stream", "file", "offset", "committed_at", "key", "renamed_from", "records"},
	file:  []string{"ino", "file_name", "created_at_ms"},
}

// decodeSettled parses a settled file as strictly as decode a sidecar:
// one JSON object, of version 1, every field present once and no other,
// no null; and each subscription's records in file order after its
// offset.
func decodeSettled(data []byte) (map[string]Settled, error) {
	raw, err := parseObject(data)
	if err != nil {
		return nil, err
	}
	var version struct{ Version json.RawMessage }
	if err := json.Unmarshal(raw, &version); err != nil {
		return nil, err
	}
	if v := string(version.Version); v != fmt.Sprint(settledVersion) {
		return nil, fmt.Errorf("unsupported version %s, this streamd reads version %d", cmp.Or(v, "(none)"), settledVersion)
	}
	if err := checkKeys(raw, settledShape); err != nil {
		return nil, err
	}
	var file settledFileJSON
	if err := decodeStrict(raw, &file); err != nil {
		return nil, err
	}
	settled := make(map[string]Settled, len(file.Subscriptions))
	for _, name := range slices.Sorted(maps.Keys(file.Subscriptions)) {
		e := file.Subscriptions[name]
		st := Settled{
			Stream:      e.Stream,
			File:        e.File.identity(),
			Offset:      e.Offset,
			Key:         e.Key,
			RenamedFrom: e.RenamedFrom,
			Records:     make([]Span, len(e.Records)),
		}
		if e.Stream == "" || e.Offset < 0 {
			return nil, fmt.Errorf("subscription %q: no stream path, or a negative offset", name)
		}
		if err := st.CommittedAt.UnmarshalText([]byte(e.CommittedAt)); err != nil || st.CommittedAt.IsZero() {
			return nil, fmt.Errorf("subscription %q: committed_at %q, want the RFC 3339 time of a commit", name, e.CommittedAt)
		}
		if len(st.RenamedFrom) == 0 {
			st.RenamedFrom = nil // as in a configuration that sets none
		}
		at := uint64(e.Offset)
		for i, r := range e.Records {
			if r[0] < at || r[1] <= r[0] || r[1] > 1<<63-1 {
				return nil, fmt.Errorf("subscription %q: record %d [%d, %d) is not after offset %d", name, i, r[0], r[1], at)
			}
			st.Records[i] = Span{Start: int64(r[0]), End: int64(r[1]), Seq: r[2], Tag: r[3]}
			at = r[1]
		}
		settled[name] = st
	}
	return settled, nil
}
