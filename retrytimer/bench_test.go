package retrytimer

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// benchPending is how many copies are pending in the benchmarks, made
// under benchKeys keys.
const (
	benchPending = 100_000
	benchKeys    = 16
)

// fill schedules n copies with payloads of size bytes, due in an hour or
// later, from many goroutines so that they share spool fsyncs. They are
// made under benchKeys keys, as a few subscriptions make them: each
// origin (Queue.Origins) is held once, however many copies share it.
func fill(tb testing.TB, q *Queue, n, size int) {
	tb.Helper()
	due := time.Now().Add(time.Hour)
	const workers = 64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				d := due.Add(time.Duration(i) * time.Millisecond)
				c := testCopy(strconv.Itoa(i), d, size)
				c.Key = "k" + strconv.Itoa(i%benchKeys)
				if err := q.Schedule(c, d); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := q.Pending(); got != n {
		tb.Fatalf("Pending = %d, want %d", got, n)
	}
}

func openBench(tb testing.TB, m mode) *Queue {
	tb.Helper()
	q, err := Open(Options{Dir: m.dir(tb), Fire: func(context.Context, Copy) error { return nil }})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := q.Close(); err != nil {
			tb.Error(err)
		}
	})
	return q
}

// BenchmarkScheduleFire schedules a due copy and fires it while 100 000
// others are pending: the heap's cost, and with a spool the fsync's.
func BenchmarkScheduleFire(b *testing.B) {
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) { scheduleFire(b, m, benchPending) })
	}
}

// BenchmarkScheduleFireScaling: Schedule+fire, memory-only, with 1 000 and
// with 100 000 copies pending; O(log n) keeps the two close.
func BenchmarkScheduleFireScaling(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run("pending="+strconv.Itoa(n), func(b *testing.B) { scheduleFire(b, modes[0], n) })
	}
}

// scheduleFire schedules a due copy and fires it, each iteration, with
// pending other copies waiting.
func scheduleFire(b *testing.B, m mode, pending int) {
	q := openBench(b, m)
	fill(b, q, pending, 1024)
	past := time.Now().Add(-time.Second)
	c := testCopy("due", past, 1024)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := q.Schedule(c, past); err != nil {
			b.Fatal(err)
		}
		if wait, err := q.fireOne(ctx); wait != 0 || err != nil {
			b.Fatalf("fireOne = %v, %v", wait, err)
		}
		q.recordDone()
	}
	if got := q.Pending(); got != pending {
		b.Fatalf("Pending = %d, want %d", got, pending)
	}
}

// heapInUse returns how much the heap in use (HeapInuse) and the live heap
// (HeapAlloc) grow, after garbage collection, with 100 000 copies of 1 KiB
// pending.
func heapInUse(tb testing.TB, m mode) (inuse, alloc uint64) {
	tb.Helper()
	q, err := Open(Options{Dir: m.dir(tb), Fire: func(context.Context, Copy) error { return nil }})
	if err != nil {
		tb.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fill(tb, q, benchPending, 1024)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if err := q.Close(); err != nil {
		tb.Fatal(err)
	}
	return after.HeapInuse - min(after.HeapInuse, before.HeapInuse), after.HeapAlloc - min(after.HeapAlloc, before.HeapAlloc)
}

// BenchmarkPending100k reports the heap that 100 000 pending copies of
// 1 KiB hold, in MiB.
func BenchmarkPending100k(b *testing.B) {
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			var inuse, alloc uint64
			for b.Loop() {
				inuse, alloc = heapInUse(b, m)
			}
			b.ReportMetric(float64(inuse)/(1<<20), "MiB-heap-inuse")
			b.ReportMetric(float64(alloc)/(1<<20), "MiB-heap-live")
		})
	}
}

// TestMemory100kPending checks that 100 000 pending copies of 1 KiB stay
// well under 100 MB with a spool, whose payloads stay on disk. (Without a
// spool the payloads are in memory by design: BenchmarkPending100k reports
// that heap, and the pipe stage bounds it.)
func TestMemory100kPending(t *testing.T) {
	if testing.Short() {
		t.Skip("schedules 100 000 copies")
	}
	inuse, alloc := heapInUse(t, mode{"spool", true})
	t.Logf("%d pending copies of 1 KiB: heap in use %.1f MiB, live heap %.1f MiB",
		benchPending, float64(inuse)/(1<<20), float64(alloc)/(1<<20))
	if inuse > 32<<20 {
		t.Errorf("heap in use %.1f MiB, want below 32 MiB", float64(inuse)/(1<<20))
	}
}
