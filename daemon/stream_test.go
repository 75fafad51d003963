package daemon

import (
	"bytes"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/streamfile"
)

// TestOpenStreamLongFileName: the daemon accepts a stream file name longer
// than the header holds (123 bytes, the limit is 111), in its configuration
// and when it opens the file, as streamd publish does: the header of the
// file it creates holds the first 111 bytes.
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
	if got := s.a.Writer().Header().FileName; got != name[:streamfile.MaxFileNameLen] {
		t.Errorf("header file name %q, want the first %d bytes of %q", got, streamfile.MaxFileNameLen, name)
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
