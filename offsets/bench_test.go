package offsets

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkCommitRate runs Store.Run with a 100 ms commit interval for ten
// intervals while a goroutine sets a subscription's position at a given
// rate: none (rate=idle), 1 000 records/s (rate=1000), or as fast as Set
// goes (rate=max). It reports the commits per interval (each commit is one
// fsync of the sidecar and one of the directory), the mean duration of a
// commit, and the rate of Set calls reached. Issue 4: one fsync per
// interval, independent of the record rate; a commit with nothing new
// writes nothing.
func BenchmarkCommitRate(b *testing.B) {
	const (
		interval  = 100 * time.Millisecond
		intervals = 10
	)
	for _, rate := range []struct {
		name  string
		every time.Duration // between two Sets; 0: no pause; <0: no Sets
	}{{"idle", -1}, {"1000", time.Millisecond}, {"max", 0}} {
		b.Run("rate="+rate.name, func(b *testing.B) {
			var commits, commitNs atomic.Int64
			s, err := Open(b.TempDir(), Options{Observe: func(d time.Duration, err error) {
				if err != nil {
					b.Error(err)
				}
				commits.Add(1)
				commitNs.Add(int64(d))
			}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.Set("bench", testPosition(0)); err != nil {
				b.Fatal(err)
			}
			if err := s.Commit(); err != nil {
				b.Fatal(err)
			}
			var offset atomic.Int64
			var total, totalNs, sets int64
			var window time.Duration
			for b.Loop() {
				commits.Store(0)
				commitNs.Store(0)
				before := offset.Load()
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				if rate.every >= 0 {
					wg.Go(func() { setAtRate(ctx, b, s, &offset, rate.every) })
				}
				done := make(chan error, 1)
				start := time.Now()
				go func() { done <- s.Run(ctx, interval) }()
				// Ticks come at interval, 2×interval, ...: the window holds
				// exactly `intervals` of them.
				time.Sleep(intervals*interval + interval/2)
				n, ns := commits.Load(), commitNs.Load()
				window += time.Since(start)
				cancel()
				wg.Wait()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				total += n
				totalNs += ns
				sets += offset.Load() - before
			}
			runs := float64(b.N)
			b.ReportMetric(float64(total)/(runs*intervals), "commits/interval")
			if total > 0 {
				b.ReportMetric(float64(totalNs)/float64(total)/1e6, "ms/commit")
			}
			b.ReportMetric(float64(sets)/window.Seconds(), "records/s")
		})
	}
}

// setAtRate sets the position of the subscription "bench" to ever larger
// offsets, pausing every between two, until ctx ends.
func setAtRate(ctx context.Context, b *testing.B, s *Store, offset *atomic.Int64, every time.Duration) {
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				return
			}
		} else if ctx.Err() != nil {
			return
		}
		if err := s.Set("bench", testPosition(offset.Add(1)*100)); err != nil {
			b.Error(err)
			return
		}
	}
}
