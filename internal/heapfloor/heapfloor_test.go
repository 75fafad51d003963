package heapfloor

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name              string
		live, floor       uint64
		base, wantPercent int
	}{
		{"before the first collection: the runtime's minimum at floor", 0, 32 * mib, 100, 800},
		{"a tiny heap: likewise", mib, 32 * mib, 100, 800},
		{"a small heap: the goal at floor", 6 * mib, 32 * mib, 100, 433},
		{"half the floor: the goal at floor, which base gives", 16 * mib, 32 * mib, 100, 100},
		{"more than half the floor: base", 20 * mib, 32 * mib, 100, 100},
		{"over the floor: base", 40 * mib, 32 * mib, 100, 100},
		{"a lower base, over half the floor", 30 * mib, 32 * mib, 50, 50},
		{"a lower base, a small heap", 8 * mib, 32 * mib, 50, 300},
		{"a higher base wins", 6 * mib, 32 * mib, 1000, 1000},
		{"a floor under the runtime's minimum: base", 0, 2 * mib, 100, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.live, tc.floor, tc.base); got != tc.wantPercent {
				t.Errorf("Percent(%d, %d, %d) = %d, want %d", tc.live, tc.floor, tc.base, got, tc.wantPercent)
			}
		})
	}
}

// gcPercent returns the collector's percent in effect.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// liveHeap returns the live heap the last collection found.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestStart: after collections, the percent is the one that puts the goal
// at the floor for the live heap; stop sets the base back.
func TestStart(t *testing.T) {
	base := gcPercent()
	if base < 0 || base > 1000 {
		t.Skipf("GOGC=%d in this environment", base)
	}
	const floor = 256 << 20 // far above this test's heap
	stop := Start(floor)
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		// The percent follows the live heap of the collection before.
		want := Percent(liveHeap(), floor, base)
		if got := gcPercent(); got == want && got > base {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the percent is %d after collections, want %d for a live heap of %d bytes", got, want, liveHeap())
		}
		time.Sleep(time.Millisecond) // for the cleanup that adjusts it
	}
	stop()
	if got := gcPercent(); got != base {
		t.Errorf("after stop, the percent is %d, want %d", got, base)
	}
	stop() // a second call does nothing
	if got := gcPercent(); got != base {
		t.Errorf("after a second stop, the percent is %d, want %d", got, base)
	}
}
