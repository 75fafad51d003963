package tail

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCrashLeftovers: zeros after the last frame, left by a crash in place
// of pages that never reached the disk, are waited at as a torn frame,
// not read as corrupt frames: once the next writer removes them and
// appends, the follower reads on with its new records, neither from the
// file's beginning again nor from inside a frame.
func TestCrashLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		torn  int // bytes of a frame before the zeros
		zeros int64
	}{
		{"zeros", 0, 4096},
		{"a torn frame ending in zeros", 20, 8192},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "z.ss")
			fs := frames("k", 1, 8, 1, 40)
			writeFile(t, path, oldHeader, fs[:5])
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.torn > 0 {
				appendFrames(t, path, fs[5:6])
				if err := os.Truncate(path, fi.Size()+int64(tc.torn)); err != nil {
					t.Fatal(err)
				}
			}
			// The size a crash left: the end of the last page written.
			if err := os.Truncate(path, (fi.Size()+int64(tc.torn))/4096*4096+tc.zeros); err != nil {
				t.Fatal(err)
			}
			read, repaired := 0, false
			onWait := func() {
				if read == 5 && !repaired {
					repaired = true
					appendFrames(t, path, fs[5:]) // removes the leftovers first
				}
			}
			obs := newObserver()
			fl, err := New(Options{Path: path, PollInterval: time.Hour, Observer: obs, Logger: testLogger(t), OnWait: onWait})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			if err := sameFrames(nextN(t, fl, 8, &read), fs); err != nil {
				t.Error(err)
			}
			for _, e := range []Event{EventChecksum, EventFormat, EventTruncated} {
				if n := obs.count(e); n != 0 {
					t.Errorf("%d %v events, want none", n, e)
				}
			}
		})
	}
}
