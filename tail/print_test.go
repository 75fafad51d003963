package tail

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// TestPrint: the header and the messages print as the file grows, and
// Print returns nil once ctx ends.
func TestPrint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.ss")
	writeFile(t, path, streamfile.Header{FileName: "p.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 2, 1, 10))
	ctx, cancel := context.WithCancel(context.Background())
	var out testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- Print(ctx, &out, path, streamfile.FormatLog, testLogger(t)) }()
	messages := func() int { return strings.Count(out.String(), " | k | ") } // payloads hold newlines
	waitFor(t, 5*time.Second, "the header and two messages", func() bool { return messages() == 2 })
	appendFrames(t, path, frames("k", 3, 1, 1, 10))
	waitFor(t, 5*time.Second, "the third message", func() bool { return messages() == 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Print returned %v after ctx ended, want nil", err)
	}
	if !strings.HasPrefix(out.String(), "# header: file_name=\"p.ss\"") || !strings.Contains(out.String(), "| k | 3 | 0]") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestPrintRotation: a file renamed away from the path is printed on for
// the daemon's default rotation_grace after another file took the path: a
// record its writer appends to it then is printed, before the new file's.
func TestPrintRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.ss")
	writeFile(t, path, streamfile.Header{FileName: "p.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 2, 1, 10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, logs testutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Print(ctx, &out, path, streamfile.FormatLog, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	waitFor(t, 5*time.Second, "two messages", func() bool { return strings.Count(out.String(), " | k | ") == 2 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the rename seen", func() bool { return strings.Contains(logs.String(), "renamed away from the path") })
	writeFile(t, path, streamfile.Header{FileName: "p.ss", CreatedAtMs: 2, BeaconInterval: 1024}, frames("n", 1, 1, 1, 10))
	appendFrames(t, path+".1", frames("k", 3, 1, 1, 10))
	waitFor(t, 15*time.Second, "the new file's message", func() bool { return strings.Contains(out.String(), " | n | 1 | ") })
	if o := out.String(); !strings.Contains(o, " | k | 3 | ") || strings.Index(o, " | k | 3 | ") > strings.Index(o, " | n | 1 | ") {
		t.Errorf("the record appended to the renamed file is not printed before the new file's:\n%s", o)
	}
	cancel()
	<-done
}

func TestPrintMissingFile(t *testing.T) {
	err := Print(context.Background(), &bytes.Buffer{}, filepath.Join(t.TempDir(), "nope.ss"), streamfile.FormatLog, testLogger(t))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Print of a missing file: %v, want fs.ErrNotExist", err)
	}
}

// countingWriter counts the writes made to it.
type countingWriter struct {
	testutil.SyncBuffer
	writes atomic.Int32
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.SyncBuffer.Write(p)
}

// TestPrintCatchingUp: the records a follower reads without waiting leave
// together, not in a write each; the last of them before it waits too.
func TestPrintCatchingUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.ss")
	writeFile(t, path, streamfile.Header{FileName: "c.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 2000, 1, 10))
	ctx, cancel := context.WithCancel(context.Background())
	out := &countingWriter{}
	done := make(chan error, 1)
	go func() { done <- Print(ctx, out, path, streamfile.FormatLog, testLogger(t)) }()
	waitFor(t, 5*time.Second, "2000 messages", func() bool { return strings.Count(out.String(), " | k | ") == 2000 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := out.writes.Load(); n > 20 {
		t.Errorf("2000 messages in %d writes, want a few large ones", n)
	}
}
