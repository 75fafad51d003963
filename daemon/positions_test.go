package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/retrytimer"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// TestWritePositions: the table has a header and aligned columns, with "-"
// for what is unknown or not stored.
func TestWritePositions(t *testing.T) {
	committed := time.Date(2026, 12, 1, 10, 30, 0, 0, time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		name    string
		reports []PositionReport
		want    string
	}{
		{"none", nil, "SUBSCRIPTION  STREAM  OFFSET  LAST SEQ  FILE SIZE  LAG  COMMITTED  NOTE\n"},
		{"stored, unstored and unconfigured", []PositionReport{
			{Subscription: "billing", Stream: "orders", Stored: &offsets.Position{Offset: 1024, LastSeq: 7, CommittedAt: committed}, FileSize: 2048, Lag: 1024},
			{Subscription: "audit", Stream: "orders", FileSize: -1, Lag: -1, Note: "no stored position: starts at end"},
			{Subscription: "gone", Stored: &offsets.Position{Offset: 64, LastSeq: 1, CommittedAt: committed}, FileSize: -1, Lag: -1, Note: "not in the configuration"},
		},
			"SUBSCRIPTION  STREAM  OFFSET  LAST SEQ  FILE SIZE  LAG   COMMITTED             NOTE\n" +
				"billing       orders  1024    7         2048       1024  2026-12-01T09:30:00Z  \n" +
				"audit         orders  -       -         -          -     -                     no stored position: starts at end\n" +
				"gone          -       64      1         -          -     2026-12-01T09:30:00Z  not in the configuration\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WritePositions(&b, tc.reports); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("table:\n%s\nwant:\n%s", b.String(), tc.want)
			}
		})
	}
}

// TestSetPosition: a position set on a stopped daemon's state directory is
// resolved to a frame boundary and shown by Positions; an unknown
// subscription is the caller's mistake, found before anything is read; a
// running daemon's lock is refused with how to go on.
func TestSetPosition(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "orders.ss")
	w, err := streamfile.OpenWriter(stream, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: "orders.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]streamfile.Frame{{Key: "orders", Payload: []byte("a")}, {Key: "orders", Payload: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	size := w.Size()
	w.Close()
	cfg, err := loadTestConfig(t, fmt.Sprintf("state_dir = %q\n[[stream]]\nname = \"orders\"\npath = %q\n", filepath.Join(dir, "state"), stream)+
		"[[subscription]]\nname = \"billing\"\nstream = \"orders\"\nkey = \"orders\"\n[subscription.handler]\nkind = \"discard\"\n", conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	var end, seq2 tail.Start
	if err := errors.Join(end.UnmarshalText([]byte("end")), seq2.UnmarshalText([]byte("seq:2"))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		sub     string
		start   tail.Start
		unknown bool
		lag     bool // the offset is before the end
		locked  bool // a daemon holds the lock
	}{
		{"end", "billing", end, false, false, false},
		{"seq:2", "billing", seq2, false, true, false},
		{"unknown", "nope", end, true, false, false},
		{"locked", "billing", end, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.locked {
				store, err := offsets.Open(cfg.StateDir, offsets.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
			}
			pos, err := SetPosition(cfg, tc.sub, tc.start)
			if _, locked := errors.AsType[*offsets.LockedError](err); locked != tc.locked {
				t.Fatalf("error %v; want a locked state directory: %v", err, tc.locked)
			}
			if tc.locked {
				const before, after = "refusing while streamd runs: ", "\nStop the daemon (systemctl stop streamd), set the position, and start it again"
				if !strings.HasPrefix(err.Error(), before) || !strings.HasSuffix(err.Error(), after) {
					t.Errorf("error %q, want %q, the lock, then %q", err, before, after)
				}
				return
			}
			if _, unknown := errors.AsType[*UnknownSubscriptionError](err); unknown != tc.unknown {
				t.Fatalf("error %v; want an unknown subscription: %v", err, tc.unknown)
			}
			if tc.unknown {
				if want := `no subscription "nope" in the configuration`; err.Error() != want {
					t.Errorf("error %q, want %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if pos.Stream != stream || (pos.Offset < size) != tc.lag {
				t.Errorf("position %+v of a %d-byte file; want one before the end: %v", pos, size, tc.lag)
			}
			reports, err := Positions(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(reports) != 1 || reports[0].Stored == nil || reports[0].Stored.Offset != pos.Offset || reports[0].Lag != size-pos.Offset {
				t.Errorf("reports %+v, want billing at offset %d with lag %d", reports, pos.Offset, size-pos.Offset)
			}
		})
	}
}

// TestCorruptSidecarAdvice: offsets show and offsets set refuse a corrupt
// sidecar next to the retry spool with the advice streamd run gives, which
// names the spool: the sidecar moved aside alone is refused at the next
// start.
func TestCorruptSidecarAdvice(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	cfg, err := loadTestConfig(t, fmt.Sprintf("state_dir = %q\n[[stream]]\nname = \"orders\"\npath = %q\n", state, filepath.Join(dir, "orders.ss"))+
		"[[subscription]]\nname = \"billing\"\nstream = \"orders\"\nkey = \"orders\"\n[subscription.handler]\nkind = \"discard\"\n", conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(os.MkdirAll(state, 0o750), os.WriteFile(filepath.Join(state, offsets.SidecarName), []byte("{"), 0o600),
		os.WriteFile(filepath.Join(state, retrytimer.SpoolName), nil, 0o600)); err != nil {
		t.Fatal(err)
	}
	var end, seq tail.Start
	if err := errors.Join(end.UnmarshalText([]byte("end")), seq.UnmarshalText([]byte("seq:2"))); err != nil {
		t.Fatal(err)
	}
	want := "or move it aside together with " + filepath.Join(state, retrytimer.SpoolName) + " to start every subscription from its start_at"
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"offsets show", func() error { _, err := Positions(cfg); return err }},
		{"offsets set", func() error { _, err := SetPosition(cfg, "billing", end); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if _, corrupt := errors.AsType[*offsets.CorruptError](err); !corrupt || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v\nwant a corrupt sidecar, with the advice %q", err, want)
			}
		})
	}
}

// TestLag: streamd_stream_lag_bytes counts what a subscription has yet to
// settle: the file at the path past its position; the whole file again
// after a truncation in place; the file past its header before a first
// position when start_at names a record to look for, but nothing yet for
// a start_at place, which the start stores;
// a rotated file's rest and the file at the path; and not known when the
// file at the path is gone.
func TestLag(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "orders.ss")
	rotated := filepath.Join(dir, "orders.ss.1")
	publish := func(payloads ...string) (streamfile.Identity, int64) {
		t.Helper()
		w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: "orders.ss", BeaconInterval: 1024}})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for _, p := range payloads {
			if err := w.Publish([]streamfile.Frame{{Key: "orders", Payload: []byte(p)}}); err != nil {
				t.Fatal(err)
			}
		}
		size, id, err := fileState(path)
		if err != nil {
			t.Fatal(err)
		}
		return id, size
	}
	oldID, oldSize := publish("a1", "a2", "a3")
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // files are told apart by their creation time
	id, size := publish("b1")

	store, err := offsets.Open(t.TempDir(), offsets.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	d := &Daemon{store: store}
	var end, seq tail.Start
	if err := errors.Join(end.UnmarshalText([]byte("end")), seq.UnmarshalText([]byte("seq:2"))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		start  tail.Start
		pos    *offsets.Position
		size   int64
		want   int64
		wantOK bool
	}{
		{"at the path", tail.Start{}, &offsets.Position{Stream: path, File: id, Offset: streamfile.HeaderSize + 1}, size, size - streamfile.HeaderSize - 1, true},
		{"truncated in place", tail.Start{}, &offsets.Position{Stream: path, File: id, Offset: size + 100}, size, size - streamfile.HeaderSize, true},
		{"no position, start_at = seq:2", seq, nil, size, size - streamfile.HeaderSize, true},
		{"no position, start_at = end", end, nil, size, 0, false},
		{"in the rotated file", tail.Start{}, &offsets.Position{Stream: path, File: oldID, Offset: oldSize - 10}, size, 10 + size - streamfile.HeaderSize, true},
		{"no file at the path", tail.Start{}, nil, -1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "_")
			if tc.pos != nil {
				if err := store.Set(name, *tc.pos); err != nil {
					t.Fatal(err)
				}
			}
			sc := conf.Subscription{Name: name, Stream: "orders", StartAt: tc.start}
			got, ok := d.lag(sc, path, tc.size, id, tc.size >= 0)
			if ok != tc.wantOK || ok && got != tc.want {
				t.Errorf("lag %d, %t; want %d, %t", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestLagAt: what is left after a position is its bytes, but nothing when
// it is the end-of-stream frame that ends the file, also when a beacon
// splits that frame (edge-d-eos.ss).
func TestLagAt(t *testing.T) {
	for _, tc := range []struct {
		file      string
		off, want int64
	}{
		{"consumer.ss", 4774, 0},           // at the end-of-stream frame
		{"consumer.ss", 4729, 4830 - 4729}, // at the last record, before it
		{"consumer.ss", 4830, 0},           // past it
		{"edge-d-eos.ss", 4076, 0},         // at the end-of-stream frame a beacon splits
		{"edge-d-eos.ss", 3877, 4251 - 3877},
		{"quicksort.ss", 8868, 8978 - 8868}, // at the last record of a file without an end-of-stream frame
		{"quicksort.ss", 8978, 0},
	} {
		path := filepath.Join("..", "testdata", "streamfile", tc.file)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := lagAt(path, tc.off, fi.Size()); got != tc.want {
			t.Errorf("%s at %d: lag %d, want %d", tc.file, tc.off, got, tc.want)
		}
	}
}
