package retrytimer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// jumpClock is a wall clock that jumps: the real clock plus a skew, read
// without a monotonic reading, so that a change of the skew is a step of
// the wall clock as a process sees it.
type jumpClock struct{ skew atomic.Int64 }

func (c *jumpClock) now() time.Time {
	return time.Now().Round(0).Add(time.Duration(c.skew.Load()))
}

func (c *jumpClock) step(d time.Duration) { c.skew.Add(int64(d)) }

// clockStep steps the clock by by, at after the copy was scheduled (0:
// before the queue runs, and for a restart before it is opened again).
type clockStep struct {
	at, by time.Duration
}

const day = 24 * time.Hour

// TestClockJump schedules one copy with a delay, steps the wall clock, and
// checks when the copy fires, measured on the monotonic clock from its
// Schedule (or from the queue's reopening, for a restart): a clock stepped
// back must not hold it much longer than its delay (at most its delay
// after the queue notices the step), a clock stepped forward may fire it
// early, and it always fires, once.
func TestClockJump(t *testing.T) {
	const d = 300 * time.Millisecond
	// slack covers scheduling delays under the race detector on a busy
	// machine; without the clamp the copies below would wait a day. early
	// covers the microseconds between the test's reading of the clock for
	// the due time and the queue's reading in Schedule, which make the
	// stored delay that much shorter.
	const slack = time.Second
	const early = 5 * time.Millisecond
	tests := []struct {
		name      string
		delay     time.Duration
		steps     []clockStep
		restart   bool // close the queue after Schedule and open it again
		failFirst bool // the first Fire fails: the copy waits RetryBackoff (d)
		min, max  time.Duration
	}{
		{name: "steady", delay: d, min: d, max: d + slack},
		{name: "back a day before Run", delay: d, steps: []clockStep{{0, -day}}, min: d, max: d + slack},
		{name: "back a day while waiting", delay: d, steps: []clockStep{{d / 2, -day}}, min: d, max: 2*d + slack},
		{name: "back a year while waiting", delay: d, steps: []clockStep{{d / 3, -365 * day}}, min: d, max: 2*d + slack},
		{name: "back less than elapsed", delay: d, steps: []clockStep{{d / 2, -d / 3}}, min: d, max: d + d/3 + slack},
		{name: "back twice", delay: d, steps: []clockStep{{0, -day}, {d / 2, -day}}, min: d, max: 2*d + slack},
		{name: "back then forward", delay: d, steps: []clockStep{{0, -day}, {d / 2, day}}, min: 0, max: d + slack},
		{name: "forward a day before Run", delay: time.Hour, steps: []clockStep{{0, day}}, min: 0, max: slack},
		{name: "forward a day while waiting", delay: d, steps: []clockStep{{d / 2, day}}, min: 0, max: d + slack},
		{name: "back a day across a restart", delay: d, restart: true, steps: []clockStep{{0, -day}}, min: d, max: d + slack},
		{name: "forward a day across a restart", delay: time.Hour, restart: true, steps: []clockStep{{0, day}}, min: 0, max: slack},
		{name: "back a day while a failed fire waits", failFirst: true, steps: []clockStep{{d / 2, -day}}, min: d, max: 2*d + slack},
	}
	for _, m := range modes {
		for _, tt := range tests {
			if tt.restart && !m.spool {
				continue
			}
			t.Run(m.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				clock := &jumpClock{}
				var tries atomic.Int32
				fired := make(chan time.Time, 10)
				fire := func(_ context.Context, c Copy) error {
					if tt.failFirst && tries.Add(1) == 1 {
						return errors.New("first try fails")
					}
					fired <- time.Now()
					return nil
				}
				opts := Options{Dir: m.dir(t), Fire: fire, Now: clock.now, RetryBackoff: d}
				q := mustOpen(t, opts)
				start := time.Now()
				if err := q.Schedule(testCopy("c", clock.now().Add(tt.delay), 0), clock.now().Add(tt.delay)); err != nil {
					t.Fatal(err)
				}
				var later []clockStep
				for _, s := range tt.steps {
					if s.at == 0 {
						if !tt.restart {
							clock.step(s.by)
						}
					} else {
						later = append(later, s)
					}
				}
				if tt.restart {
					if err := q.Close(); err != nil {
						t.Fatal(err)
					}
					for _, s := range tt.steps {
						clock.step(s.by)
					}
					start = time.Now() // Open reads the clock: the copy is due its delay after that
					q = mustOpen(t, opts)
				}
				var wg sync.WaitGroup
				for _, s := range later {
					wg.Add(1)
					timer := time.AfterFunc(s.at-time.Since(start), func() {
						clock.step(s.by)
						wg.Done()
					})
					t.Cleanup(func() {
						if timer.Stop() {
							wg.Done()
						}
						wg.Wait()
					})
				}
				stop := runQueue(t, q)
				var at time.Time
				select {
				case at = <-fired:
				case <-time.After(tt.max + 2*time.Second):
					t.Fatalf("the copy did not fire within %s (clock skew now %s)", tt.max+2*time.Second, time.Duration(clock.skew.Load()))
				}
				stop()
				if got := at.Sub(start); got < tt.min-early || got > tt.max {
					t.Errorf("fired %s after it was scheduled, want %s to %s", got.Round(time.Millisecond), tt.min, tt.max)
				}
				if n := q.Pending(); n != 0 {
					t.Errorf("%d pending after the copy fired, want 0", n)
				}
				select {
				case <-fired:
					t.Errorf("the copy fired twice")
				default:
				}
			})
		}
	}
}

// TestSpoolTypeOneRecords opens a spool written before schedule records
// kept their delay (type 1 records only): its copies load and fire at their
// due times, new copies are appended as type 4 records, and the mixed file
// loads again. A type 1 copy has no delay to clamp to: a clock stepped back
// delays it as before.
func TestSpoolTypeOneRecords(t *testing.T) {
	now := time.Now()
	// Without headers, a type 1 copy fires its payload as it is: the
	// recorder reads the due time from it. TestSpoolLegacyRecords covers
	// headers.
	v1 := func(id uint64, key string, due time.Time) []byte {
		c := testCopy(key, due, 0)
		return encodeLegacy(recScheduleV1, id, due.UnixNano(), 0, c.Stream, c.Key, legacyFields{payload: c.Record})
	}
	var data []byte
	data = append(data, fileMagic...)
	data = append(data, v1(1, "old-past", now.Add(-time.Minute))...)
	data = append(data, v1(2, "old-fired", now.Add(-time.Minute))...)
	data = append(data, encodeDone(2)...)
	data = append(data, v1(3, "old-future", now.Add(time.Hour))...)
	dir, _ := writeSpool(t, data)

	clock := &jumpClock{}
	clock.step(-day) // the type 1 copy due in an hour keeps its due time
	rec := &recorder{t: t}
	q, err := Open(Options{Dir: dir, Fire: rec.fire, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pendingKeys(t, q), []string{"old-past", "old-future"}; !slices.Equal(got, want) {
		t.Errorf("pending %v, want %v", got, want)
	}
	q.mu.Lock()
	for _, e := range q.h {
		if e.delay != unknownDelay {
			t.Errorf("type 1 copy %d has delay %d, want unknown", e.id, e.delay)
		}
	}
	q.mu.Unlock()
	clock.step(day)
	mustSchedule(t, q, "new", time.Now().Add(-time.Second))
	fireDue(t, q)
	if got := rec.all(); len(got) != 2 || got[0].key != "old-past" || got[1].key != "new" {
		t.Errorf("fired %v, want old-past and new", got)
	}
	mustSchedule(t, q, "new-future", time.Now().Add(time.Hour))
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, Options{Dir: dir, Fire: rec.fire})
	if got, want := pendingKeys(t, q), []string{"old-future", "new-future"}; !slices.Equal(got, want) {
		t.Errorf("pending after reopening %v, want %v", got, want)
	}
	q.mu.Lock()
	for _, e := range q.h {
		if e.id == 3 && e.delay != unknownDelay || e.id != 3 && (e.delay < 59*int64(time.Minute) || e.delay > int64(time.Hour)) {
			t.Errorf("copy %d has delay %s", e.id, time.Duration(e.delay))
		}
	}
	q.mu.Unlock()
}
