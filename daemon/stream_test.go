package daemon

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
)

// TestOpenStreamLongFileName: the daemon accepts a stream file name longer
// than the header holds (123 bytes, the limit is 111), in its configuration
// and when it opens the file, as streamd publish does: the header of the
// file it creates holds its first 102 bytes, "~" and a hash of the whole.
func TestOpenStreamLongFileName(t *testing.T) {
	name := strings.Repeat("n", 120) + ".ss"
	cfg, err := loadTestConfig(t, fmt.Sprintf("state_dir = %q\n[[stream]]\nname = \"long\"\npath = %q\n", t.TempDir(), filepath.Join(t.TempDir(), name))+
		"[[subscription]]\nname = \"s\"\nstream = \"long\"\nkey = \"k\"\n[subscription.handler]\nkind = \"discard\"\n", conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openStream(cfg.Streams[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if got := s.a.Writer().Header().FileName; got != name[:102]+"~8f4f9619" {
		t.Errorf("header file name %q, want the first 102 bytes of %q and its hash", got, name)
	}
}

// TestStreamSyncWaitsForTheFsyncInFlight: a sync that comes while another
// one's fsync runs (the commit loop and the retry queue both sync) returns
// only once that fsync is done: a copy counts as durable only after an
// fsync that began after it was appended succeeded (Invariant 2).
func TestStreamSyncWaitsForTheFsyncInFlight(t *testing.T) {
	cfg := conf.Stream{Name: "orders", Path: filepath.Join(t.TempDir(), "orders.ss"), Create: true, BeaconInterval: 1 << 20, FileMode: 0o640}
	s, err := openStream(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if err := s.append("orders", bytes.Repeat([]byte("x"), 32<<20)); err != nil { // an fsync that takes a while
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- s.sync() }()
	for s.syncMu.TryLock() { // until the first sync holds it
		s.syncMu.Unlock()
		select {
		case <-first:
			t.Skip("the first fsync was done before the test saw it run (a file system without a disk?)")
		default:
			runtime.Gosched()
		}
	}
	if err := s.sync(); err != nil {
		t.Fatal(err)
	}
	// The second sync waited: the first one's fsync is done, and counted.
	s.syncMu.Lock()
	synced, appended := s.synced, s.appended
	s.syncMu.Unlock()
	if synced != appended {
		t.Errorf("the second sync returned with %d of %d appends synced: the first one's fsync was still running", synced, appended)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// TestReloadRemovedStreamSyncFails: a reload removes a stream whose last
// fsync fails (its copies may be lost): the daemon stops, and no commit,
// the last one included, stores a position past the copy, which no fsync
// covers any more once the stream is gone.
func TestReloadRemovedStreamSyncFails(t *testing.T) {
	dir := t.TempDir()
	orders, other := filepath.Join(dir, "orders.ss"), filepath.Join(dir, "other.ss")
	w, err := streamfile.OpenWriter(other, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: "other.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Publish([]streamfile.Frame{{Key: "jobs", Payload: []byte("j1")}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	base := fmt.Sprintf("state_dir = %q\nshutdown_timeout = \"1s\"\ncommit_interval = \"1h\"\n[metrics]\nlisten = \"\"\n"+
		"[[stream]]\nname = \"orders\"\npath = %q\n", filepath.Join(dir, "state"), orders)
	sub := func(name, stream, key, extra string) string {
		return fmt.Sprintf("\n[[subscription]]\nname = %q\nstream = %q\nkey = %q\n%s\n[subscription.handler]\nkind = \"discard\"\n", name, stream, key, extra)
	}
	cfg, err := loadTestConfig(t, base+fmt.Sprintf("[[stream]]\nname = \"other\"\npath = %q\n", other)+
		sub("a", "orders", "orders", "")+sub("b", "other", "jobs", "max_attempts = 5\nstart_at = \"beginning\""), conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	hb := newRecorder(func(_ context.Context, d *handler.Delivery) handler.Outcome {
		if d.Attempt == 1 {
			return retry // a copy appended to other.ss
		}
		return ack
	})
	d := New(cfg, Options{Handlers: map[string]handler.Handler{"a": newRecorder(nil), "b": hb}, Registry: prometheus.NewRegistry()})
	done := make(chan error, 1)
	go func() { done <- d.Run(t.Context()) }()
	hb.waitN(t, 2) // j1, then its copy
	waitFor(t, "the copy of j1 settled", func() bool {
		p, ok := d.store.Get("b")
		return ok && p.LastSeq >= 2
	})
	d.mu.Lock()
	d.streams["other"].a.Writer().Close() // its fsync fails from now on, as after an I/O error
	d.mu.Unlock()
	removed, err := loadTestConfig(t, base+sub("a", "orders", "orders", ""), conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	d.Reload(t.Context(), func() (*conf.Config, error) { return removed, nil })
	select {
	case err := <-done:
		if err == nil {
			t.Error("Run ended without the failed fsync")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the daemon did not stop after the fsync of a removed stream failed")
	}
	stored, err := offsets.Load(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := stored["b"]; ok && p.LastSeq >= 1 {
		t.Errorf("the sidecar holds b at seq %d, past the copy whose fsync failed", p.LastSeq)
	}
}
