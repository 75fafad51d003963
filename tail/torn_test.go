package tail

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// TestTornTailSaid: a file that ends inside a frame, unchanged, is waited
// at; after tornTailSaid it is logged at WARN and counted, once, and
// once a writer removed the torn frame and appended, the follower reads
// on and says so.
func TestTornTailSaid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "r.ss")
		first, items, obs, log := followTorn(t, path, 0)
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

// TestTornTailRotated: a file rotated away while it ends inside a frame is
// left once quiet for the grace, and the switch says the frame is lost and
// counts it once, whether or not the follower said the torn tail before
// (after tornTailSaid); it never says the record was completed.
func TestTornTailRotated(t *testing.T) {
	for _, said := range []bool{false, true} {
		t.Run(fmt.Sprintf("said before %v", said), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "r.ss")
				first, items, obs, log := followTorn(t, path, time.Second)
				got := collect(t, items, len(first), time.Minute)
				if said {
					time.Sleep(tornTailSaid + 5*time.Second)
					synctest.Wait()
				}
				rename(t, dir, "r.ss", "r.ss.1")
				next := frames("n", 1, 1, 1, 10)
				writeFile(t, path, lastHeader, next)
				got = append(got, collect(t, items, 1, time.Minute)...)
				if err := sameFrames(got, append(first, next...)); err != nil {
					t.Fatal(err)
				}
				l := log.String()
				if !strings.Contains(l, "replaced file ends inside a frame; that frame is lost") || obs.count(EventTornTail) != 1 || strings.Contains(l, "no longer ends inside a record") {
					t.Errorf("torn tails counted %d, want 1, and the loss said at the switch alone:\n%s", obs.count(EventTornTail), l)
				}
			})
		})
	}
}

// followTorn writes three frames at path, then the first 30 bytes of a
// fourth (a torn append), and follows the file (polling every second, the
// grace given) until the test ends; it returns the whole frames, the
// follower's items, its observer and its log.
func followTorn(t *testing.T, path string, grace time.Duration) ([]streamfile.Frame, <-chan item, *observer, *testutil.SyncBuffer) {
	t.Helper()
	first := frames("k", 1, 3, 1, 40)
	writeFile(t, path, oldHeader, first)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	appendFrames(t, path, frames("k", 4, 1, 4, 100))
	if err := os.Truncate(path, fi.Size()+30); err != nil {
		t.Fatal(err)
	}
	log, obs := new(testutil.SyncBuffer), newObserver()
	fl, err := New(Options{Path: path, PollOnly: true, PollInterval: time.Second, RotationGrace: grace, Observer: obs,
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	items, stop := follow(t, fl)
	t.Cleanup(func() { stop(); fl.Close() })
	return first, items, obs, log
}
