package heapfloor

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name                 string
		live, scanned, floor uint64
		base, wantPercent    int
	}{
		{"before the first collection: the runtime's minimum at floor", 0, 0, 32 * mib, 100, 800},
		{"a tiny heap: likewise", mib, mib, 32 * mib, 100, 800},
		{"a small heap: the goal at floor", 6 * mib, 6 * mib, 32 * mib, 100, 433},
		{"stacks and globals are scanned too", 6 * mib, 8 * mib, 32 * mib, 100, 325},
		{"half the floor: the goal at floor, which base gives", 16 * mib, 16 * mib, 32 * mib, 100, 100},
		{"more than half the floor: base", 20 * mib, 20 * mib, 32 * mib, 100, 100},
		{"over the floor: base", 40 * mib, 41 * mib, 32 * mib, 100, 100},
		{"a lower base, over half the floor", 30 * mib, 30 * mib, 32 * mib, 50, 50},
		{"a lower base, a small heap", 8 * mib, 8 * mib, 32 * mib, 50, 300},
		{"a higher base wins", 6 * mib, 6 * mib, 32 * mib, 1000, 1000},
		{"a floor under the runtime's minimum: base", 0, 0, 2 * mib, 100, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.live, tc.scanned, tc.floor, tc.base); got != tc.wantPercent {
				t.Errorf("Percent(%d, %d, %d, %d) = %d, want %d", tc.live, tc.scanned, tc.floor, tc.base, got, tc.wantPercent)
			}
		})
	}
}

func TestBusy(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		allocated uint64
		elapsed   time.Duration
		want      bool
	}{
		{32 * mib, time.Second, true},
		{32*mib - 1, time.Second, false},
		{4 * mib, 100 * time.Millisecond, true},
		{mib, 100 * time.Millisecond, false},
		{32 * mib, 2 * time.Minute, false}, // a forced collection of a quiet daemon
		{0, 0, true},
	} {
		if got := Busy(tc.allocated, tc.elapsed, 32*mib); got != tc.want {
			t.Errorf("Busy(%d, %s, 32 MiB) = %v, want %v", tc.allocated, tc.elapsed, got, tc.want)
		}
	}
}

// sink keeps the garbage the tests allocate from being optimised away.
var sink []byte

// read returns the collector's percent in effect, and the live heap and
// the memory scanned (heap, stacks, globals) that the last collection found.
func read() (percent int, live, scanned uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}
	metrics.Read(s)
	live = s[1].Value.Uint64()
	return int(s[0].Value.Uint64()), live, live + s[2].Value.Uint64() + s[3].Value.Uint64()
}

// collectUntil runs collections, each after some garbage (busy at any
// rate the tests use), until done holds once the collection's cleanups had
// a moment to run.
func collectUntil(t *testing.T, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sink = make([]byte, 64<<10)
		runtime.GC()
		if done() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 s of collections", what)
		}
		time.Sleep(time.Millisecond) // for the cleanup that adjusts the percent
	}
}

// floorPercent runs collections until the percent in effect is the one
// Percent gives for what the last one found, for floor and base, and
// returns it.
func floorPercent(t *testing.T, floor uint64, base int) int {
	t.Helper()
	var percent int
	collectUntil(t, "percent at the floor", func() bool {
		var live, scanned uint64
		percent, live, scanned = read()
		return percent == Percent(live, scanned, floor, base)
	})
	return percent
}

// adjustedAfter runs collections until k made n adjustments more than it
// had.
func adjustedAfter(t *testing.T, k *keeper, n int) {
	t.Helper()
	adjusted := func() int {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.adjusted
	}
	want := adjusted() + n
	collectUntil(t, fmt.Sprintf("%d adjustments", n), func() bool { return adjusted() >= want })
}

// baseOrSkip returns the percent in effect, and skips the test when the
// environment set one that would hide the floor.
func baseOrSkip(t *testing.T) int {
	base, _, _ := read()
	if base < 0 || base > 100 {
		t.Skipf("GOGC=%d in this environment", base)
	}
	return base
}

// TestStart: after each collection of a busy process, the percent is the
// one that puts the goal at the floor for the live heap; stop sets the
// base back.
func TestStart(t *testing.T) {
	base := baseOrSkip(t)
	const floor = 64 << 20
	held := make([]byte, 8<<20) // a live heap for which the percent is under its cap
	for i := range held {
		held[i] = byte(i)
	}
	k := start(floor, 1) // busy whatever the machine's speed
	stop := k.stop
	defer stop()
	withHeld := floorPercent(t, floor, base)
	if withHeld <= base || withHeld >= floor*100/runtimeMinimum {
		t.Fatalf("with 8 MiB live, the percent is %d, want between %d and the cap", withHeld, base)
	}
	runtime.KeepAlive(held)
	held = nil
	// A second change, after a later collection: the hook is armed again.
	if without := floorPercent(t, floor, base); without <= withHeld {
		t.Fatalf("with 8 MiB less live, the percent is %d, want more than %d", without, withHeld)
	}
	stop()
	if got, _, _ := read(); got != base {
		t.Errorf("after stop, the percent is %d, want %d", got, base)
	}
	stop() // a second call does nothing
	if got, _, _ := read(); got != base {
		t.Errorf("after a second stop, the percent is %d, want %d", got, base)
	}
}

// TestStartQuiet: a process that allocates less than the rate keeps the
// base percent, collection after collection.
func TestStartQuiet(t *testing.T) {
	base := baseOrSkip(t)
	k := start(64<<20, 1<<50)
	defer k.stop()
	adjustedAfter(t, k, 3)
	if percent, _, _ := read(); percent != base {
		t.Fatalf("the percent is %d, want %d", percent, base)
	}
}

// TestStartQuietAgain: once the process allocates less than the rate, the
// next collection puts the base percent back, and a busy time raises it
// again.
func TestStartQuietAgain(t *testing.T) {
	base := baseOrSkip(t)
	k := start(64<<20, 1)
	defer k.stop()
	setRate := func(rate uint64) {
		k.mu.Lock()
		k.rate = rate
		k.mu.Unlock()
	}
	for _, phase := range []struct {
		rate uint64
		busy bool
	}{{1, true}, {1 << 50, false}, {1, true}} {
		setRate(phase.rate)
		adjustedAfter(t, k, 2) // the first measures a time partly before the change
		percent, _, _ := read()
		if busy := percent > base; busy != phase.busy {
			t.Fatalf("at %d bytes a second, the percent is %d (base %d), want busy %v", phase.rate, percent, base, phase.busy)
		}
	}
}
