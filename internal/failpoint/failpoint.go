// Package failpoint kills the process with SIGKILL at chosen points of its
// own code, so that crash tests can cut an operation in the middle instead
// of wherever a kill from outside happens to land.
//
// Production code marks a point with one call, [Hit] or [TornWrite], naming
// it with one of the constants below. A point is armed only by the
// environment variable STREAMD_FAILPOINTS, read once when the process
// starts:
//
//	STREAMD_FAILPOINTS="streamfile.append=3,offsets.commit=5"
//
// arms streamfile.append to kill the process on its 3rd hit and
// offsets.commit on its 5th; hits are counted from the start of the process.
// A point armed with ":hang", as in offsets.commit=5:hang, does not kill:
// the goroutine that makes the armed hit blocks for good instead, as one
// stuck in a hung fsync would, so that tests can see what notices a wedged
// loop (the systemd watchdog).
// Without the variable every hook is one load of a package-level bool and a
// branch: [Hit] and [TornWrite] are small enough to be inlined, and the
// counting lives behind the bool. A malformed value, or an unknown point,
// makes the process exit with status 2 at start, naming the problem, so that
// a crash test never runs with a point silently disarmed.
//
// On the killing hit the process writes one line to standard error,
//
//	failpoint: streamfile.append: hit 3: wrote 37 of 81 bytes at offset 4096; kill -9
//
// and sends itself SIGKILL, with whatever locks the caller holds still held:
// the kernel releases them, as it would after a kill -9 from outside. The
// calling goroutine never returns.
package failpoint

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvVar is the environment variable that arms points.
const EnvVar = "STREAMD_FAILPOINTS"

// The points. Each is a place where a kill -9 leaves a half-done operation
// on disk.
const (
	// StreamfileAppend is in streamfile.Writer's batch, under the file's
	// flock and before its bytes are written: a torn append, a random
	// prefix of the batch written and the rest missing, not fsynced.
	StreamfileAppend = "streamfile.append"
	// OffsetsWrite is in the sidecar commit, before the temporary sidecar
	// is written: a random prefix of it is written, then the kill.
	OffsetsWrite = "offsets.write"
	// OffsetsCommit is in the sidecar commit after the temporary sidecar
	// was written, fsynced and closed, before it is renamed over the
	// sidecar.
	OffsetsCommit = "offsets.commit"
	// RetrytimerSpool is in the retry spool's append of a record (a
	// schedule or a done record), before it is written: a random prefix of
	// the record is written, then the kill.
	RetrytimerSpool = "retrytimer.spool"
)

// Points lists every point, in the order of the constants.
var Points = []string{StreamfileAppend, OffsetsWrite, OffsetsCommit, RetrytimerSpool}

// armed is set once, before main, when EnvVar arms a point; read-only after.
var armed bool

var (
	mu     sync.Mutex
	target map[string]Arm // point → how it is armed; set before main
	hits   map[string]int // guarded by mu
)

func init() {
	v, ok := os.LookupEnv(EnvVar)
	if !ok || v == "" {
		return
	}
	t, err := Parse(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", EnvVar, v, err)
		os.Exit(2)
	}
	target, hits, armed = t, make(map[string]int), len(t) > 0
}

// Arm is how a point is armed: the hit that fires it, and whether it hangs
// instead of killing.
type Arm struct {
	Hit  int
	Hang bool
}

// Parse parses a value of EnvVar: comma-separated point=N or point=N:hang
// items, N ≥ 1, each point at most once.
func Parse(v string) (map[string]Arm, error) {
	out := make(map[string]Arm)
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, num, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want point=N", item)
		}
		if !slices.Contains(Points, name) {
			return nil, fmt.Errorf("unknown point %q (points: %s)", name, strings.Join(Points, ", "))
		}
		num, hang := strings.CutSuffix(num, ":hang")
		n, err := strconv.Atoi(num)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want a hit number of at least 1, optionally followed by :hang", item)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("point %q armed twice", name)
		}
		out[name] = Arm{Hit: n, Hang: hang}
	}
	return out, nil
}

// Hit counts a hit of the point name and kills the process (or hangs) if it
// is the armed hit. Disarmed, it costs a bool check.
func Hit(name string) {
	if armed {
		hit(name, nil, nil, 0)
	}
}

// TornWrite counts a hit of the point name, which comes just before p is
// written at offset off of f. If it is the armed hit, it writes a random
// prefix of p there (at least one byte and not all of p, when p has two
// bytes or more) and kills the process: a write torn by a crash. Disarmed,
// it costs a bool check.
func TornWrite(name string, f io.WriterAt, p []byte, off int64) {
	if armed {
		hit(name, f, p, off)
	}
}

func hit(name string, f io.WriterAt, p []byte, off int64) {
	mu.Lock()
	a, ok := target[name]
	if !ok {
		mu.Unlock()
		return
	}
	hits[name]++
	n := hits[name]
	if n != a.Hit {
		mu.Unlock()
		return
	}
	if a.Hang {
		mu.Unlock()
		fmt.Fprintf(os.Stderr, "failpoint: %s: hit %d: hang\n", name, n)
		for {
			time.Sleep(time.Hour) // until the process is killed
		}
	}
	// mu stays locked: no other point fires while this one kills.
	what := ""
	if f != nil {
		k := 0
		if len(p) >= 2 {
			k = 1 + rand.IntN(len(p)-1)
		}
		what = fmt.Sprintf(" wrote %d of %d bytes at offset %d;", k, len(p), off)
		if _, err := f.WriteAt(p[:k], off); err != nil {
			what = fmt.Sprintf(" writing %d of %d bytes at offset %d failed: %v;", k, len(p), off, err)
		}
	}
	fmt.Fprintf(os.Stderr, "failpoint: %s: hit %d:%s kill -9\n", name, n, what)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	for {
		time.Sleep(time.Hour) // the signal is on its way
	}
}
