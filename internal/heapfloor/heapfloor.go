// Package heapfloor keeps Go's garbage collector from running while the
// heap is small and the process busy: after each collection, it raises the
// collector's percent (GOGC) so that the heap may grow to a floor before
// the next one, while the process allocates the floor or more a second.
//
// With the default GOGC=100, a heap of a few live megabytes is collected
// each time it doubles. A daemon that forwards records allocates for each
// of them (in its clients' libraries too) while it keeps little alive, so
// it would collect tens of times a second, and pay for each collection's
// fixed costs and for the pages the runtime returns to the system and
// faults in again: a fifth of its CPU when it forwards into NATS. Once the
// live heap reaches half the floor, GOGC alone sets the goal; below that,
// the floor costs at most the floor less the runtime's own minimum goal of
// 4 MiB. A process that allocates less, such as a daemon that follows a
// quiet file, collects as GOGC says and keeps its small heap.
//
// A memory limit (GOMEMLIMIT) still holds: the collector runs as the
// process nears it, whatever the percent.
package heapfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Default is the floor streamd keeps.
const Default = 32 << 20

// runtimeMinimum is the heap goal of the runtime at GOGC=100 while the
// live heap is smaller or unknown (before the first collection); it scales
// with the percent.
const runtimeMinimum = 4 << 20

// Percent returns the collector's percent that sets the heap goal (the
// heap size by which the next collection should end) at floor,
// and base when that would be less. The goal is the live heap plus percent
// of the memory a collection scans: the live heap, the goroutines' stacks
// and the globals (scanned). The runtime's own minimum goal, which grows
// with the percent, stays at floor or below, for a heap of a few MiB and
// before the first collection.
func Percent(live, scanned, floor uint64, base int) int {
	p := floor * 100 / runtimeMinimum
	switch {
	case live >= floor:
		p = 0
	case scanned > 0:
		p = min(p, (floor-live)*100/scanned)
	}
	return int(max(uint64(base), p))
}

// Busy reports whether a process that allocated allocated bytes in elapsed
// allocates at least rate bytes a second.
func Busy(allocated uint64, elapsed time.Duration, rate uint64) bool {
	return float64(allocated) >= float64(rate)*elapsed.Seconds()
}

// keeper adjusts the percent after each collection until stopped.
type keeper struct {
	floor   uint64
	base    int
	rate    uint64           // the allocation rate, in bytes a second, from which the process is busy
	samples []metrics.Sample // the live heap, the stacks, the globals, the bytes allocated

	mu        sync.Mutex
	stopped   bool
	percent   int       // the percent set last
	at        time.Time // the time of the last adjustment, zero before the first
	allocated uint64    // the bytes allocated then
	adjusted  int       // the adjustments made
}

// sentinel is allocated to learn when a collection ran: its cleanup runs
// after the first collection that finds it unreachable. The pointer keeps
// it out of the allocator's tiny blocks, in which a cleanup may never run.
type sentinel struct{ _ *byte }

// Start keeps the heap goal at floor or above after each collection that
// ends a time in which the process allocated floor bytes a second or more
// (the time since the collection before, from the second after Start on),
// for a percent in effect (base: GOGC, or 100) that would set it lower;
// after any other collection, the percent is base. A raised percent holds
// until the next collection: for a process gone quiet, Go's forced one,
// up to two minutes later, the heap bounded by the floor. The returned function
// stops and sets base back. A collector turned off (GOGC=off) stays off.
// The process has one percent: while started, the keeper overrides anyone
// else who sets it.
func Start(floor uint64) (stop func()) {
	if k := start(floor, floor); k != nil {
		return k.stop
	}
	return func() {}
}

// start is Start, with the process busy from rate bytes allocated a
// second; it returns nil for a collector turned off.
func start(floor, rate uint64) *keeper {
	k := &keeper{floor: floor, rate: rate, samples: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"},
		{Name: "/gc/heap/allocs:bytes"},
	}}
	gogc := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(gogc)
	v := gogc[0].Value.Uint64()
	if v > math.MaxInt32 { // off: -1
		return nil
	}
	k.base, k.percent = int(v), int(v)
	k.arm()
	return k
}

// arm makes the next collection call adjust.
func (k *keeper) arm() {
	runtime.AddCleanup(new(sentinel), func(k *keeper) { k.adjust() }, k)
}

// adjust sets the percent for the live heap the last collection found and
// the rate of allocation since the last adjustment, and arms the next one.
func (k *keeper) adjust() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	now := time.Now()
	metrics.Read(k.samples)
	live, allocated := k.samples[0].Value.Uint64(), k.samples[3].Value.Uint64()
	scanned := live + k.samples[1].Value.Uint64() + k.samples[2].Value.Uint64()
	p := k.base
	// The first collection measures what came before the start: a
	// daemon's own start-up, not its load.
	if !k.at.IsZero() && allocated >= k.allocated && Busy(allocated-k.allocated, now.Sub(k.at), k.rate) {
		p = Percent(live, scanned, k.floor, k.base)
	}
	k.at, k.allocated = now, allocated
	k.adjusted++
	if p != k.percent {
		debug.SetGCPercent(p)
		k.percent = p
	}
	k.arm()
}

// stop sets the base percent back; the cleanup armed last does nothing.
func (k *keeper) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.stopped {
		k.stopped = true
		debug.SetGCPercent(k.base)
	}
}
