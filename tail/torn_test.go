package tail

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/streamd/streamd/internal/testutil"
)

// TestTornTailSaid: a file that ends inside a frame, unchanged, is waited
// at; after tornTailSaid it is logged at WARN and counted, once, and
// once a writer removed the torn frame and appended, the follower reads
// on and says so.
func TestTornTailSaid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "r.ss")
		first := frames("k", 1, 3, 1, 40)
		writeFile(t, path, oldHeader, first)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		appendFrames(t, path, frames("k", 4, 1, 4, 100))
		if err := os.Truncate(path, fi.Size()+30); err != nil { // a torn append
			t.Fatal(err)
		}
		var log testutil.SyncBuffer
		obs := newObserver()
		fl, err := New(Options{Path: path, PollOnly: true, PollInterval: time.Second, Observer: obs,
			Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		items, stop := follow(t, fl)
		defer stop()
		got := collect(t, items, len(first), time.Minute)
		time.Sleep(tornTailSaid - 2*time.Second)
		synctest.Wait()
		if n := obs.count(EventTornTail); n != 0 {
			t.Fatalf("%d torn tails counted before %s, want 0", n, tornTailSaid)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := obs.count(EventTornTail); n != 1 {
			t.Fatalf("%d torn tails counted, want 1\n%s", n, log.String())
		}
		if !strings.Contains(log.String(), "level=WARN msg=\"the stream file ends inside a record") || !strings.Contains(log.String(), "bytes=30") {
			t.Fatalf("the torn tail is not logged at WARN with its size:\n%s", log.String())
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := obs.count(EventTornTail); n != 1 {
			t.Fatalf("%d torn tails counted a minute later, want 1 still", n)
		}
		next := frames("k", 4, 1, 4, 20)
		appendFrames(t, path, next) // removes the torn frame first
		got = append(got, collect(t, items, 1, time.Minute)...)
		if err := sameFrames(got, append(first, next...)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(log.String(), "level=INFO msg=\"the stream file no longer ends inside a record") {
			t.Fatalf("reading on past the torn tail is not said:\n%s", log.String())
		}
	})
}
