package retrytimer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/streamd/streamd/internal/testutil"
)

func TestFiresInDueOrder(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{t: t}
				q := mustOpen(t, Options{Dir: m.dir(t), Fire: r.fire})
				start := time.Now()
				at := func(d time.Duration) time.Time { return start.Add(d) }
				// Scheduled before Run: out of order, with ties.
				mustSchedule(t, q, "c", at(3*time.Second))
				mustSchedule(t, q, "b1", at(2*time.Second))
				mustSchedule(t, q, "a", at(time.Second))
				mustSchedule(t, q, "b2", at(2*time.Second))
				mustSchedule(t, q, "now", at(0))
				mustSchedule(t, q, "b3", at(2*time.Second))
				runQueue(t, q)
				synctest.Wait()
				if got := q.Pending(); got != 5 {
					t.Errorf("Pending after the first fire = %d, want 5", got)
				}
				// Scheduled while Run waits for "a": an earlier copy resets the timer.
				time.Sleep(100 * time.Millisecond)
				mustSchedule(t, q, "early", at(500*time.Millisecond))
				mustSchedule(t, q, "b4", at(2*time.Second))
				time.Sleep(10 * time.Second)
				synctest.Wait()

				want := []fired{
					{"now", at(0)},
					{"early", at(500 * time.Millisecond)},
					{"a", at(time.Second)},
					{"b1", at(2 * time.Second)},
					{"b2", at(2 * time.Second)},
					{"b3", at(2 * time.Second)},
					{"b4", at(2 * time.Second)},
					{"c", at(3 * time.Second)},
				}
				checkFired(t, r.all(), want)
				if got := q.Pending(); got != 0 {
					t.Errorf("Pending = %d, want 0", got)
				}
			})
		})
	}
}

func checkFired(t *testing.T, got, want []fired) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("fired %v, want %v", got, want)
	}
	for i := range want {
		if got[i].key != want[i].key || !got[i].at.Equal(want[i].at) {
			t.Errorf("fire %d = %s at %v, want %s at %v", i, got[i].key, got[i].at, want[i].key, want[i].at)
		}
	}
}

func TestOverdueFiresAtOnce(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{t: t}
				q := mustOpen(t, Options{Dir: m.dir(t), Fire: r.fire})
				start := time.Now()
				mustSchedule(t, q, "hour-ago", start.Add(-time.Hour))
				mustSchedule(t, q, "minute-ago", start.Add(-time.Minute))
				mustSchedule(t, q, "later", start.Add(time.Minute))
				runQueue(t, q)
				synctest.Wait()
				checkFired(t, r.all(), []fired{{"hour-ago", start}, {"minute-ago", start}})
			})
		})
	}
}

// TestRestartFiresOverdue stops a spooled queue before its copies are due
// and opens the spool again after they are.
func TestRestartFiresOverdue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		r := &recorder{t: t}
		q, err := Open(Options{Dir: dir, Fire: r.fire})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		mustSchedule(t, q, "a", start.Add(2*time.Second))
		mustSchedule(t, q, "b", start.Add(time.Second))
		mustSchedule(t, q, "c", start.Add(time.Hour))
		stop := runQueue(t, q)
		time.Sleep(500 * time.Millisecond)
		stop()
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}

		time.Sleep(10 * time.Second) // down past two due times
		q = mustOpen(t, Options{Dir: dir, Fire: r.fire})
		if got := q.Pending(); got != 3 {
			t.Fatalf("Pending after restart = %d, want 3", got)
		}
		runQueue(t, q)
		synctest.Wait()
		restart := start.Add(10500 * time.Millisecond)
		checkFired(t, r.all(), []fired{{"b", restart}, {"a", restart}})
		time.Sleep(time.Hour)
		synctest.Wait()
		checkFired(t, r.all(), []fired{{"b", restart}, {"a", restart}, {"c", start.Add(time.Hour)}})
	})
}

func TestFireErrorRetries(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs testutil.SyncBuffer
				fails := 3
				r := &recorder{t: t, fail: func(c Copy) error {
					if c.Key == "flaky" && fails > 0 {
						fails--
						return errors.New("stream file is full")
					}
					return nil
				}}
				dir := m.dir(t)
				q := mustOpen(t, Options{
					Dir:             dir,
					Fire:            r.fire,
					Logger:          slog.New(slog.NewTextHandler(&logs, nil)),
					RetryBackoff:    time.Second,
					MaxRetryBackoff: 3 * time.Second,
				})
				start := time.Now()
				mustSchedule(t, q, "flaky", start)
				mustSchedule(t, q, "steady", start.Add(2*time.Second))
				runQueue(t, q)
				synctest.Wait()
				if got := q.Pending(); got != 2 {
					t.Errorf("Pending after a failed fire = %d, want 2", got)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				// Tries at 0, 1s, 1s+2s, 3s+3s (capped); steady is not held up.
				checkFired(t, r.all(), []fired{
					{"steady", start.Add(2 * time.Second)},
					{"flaky", start.Add(6 * time.Second)},
				})
				if got := q.Pending(); got != 0 {
					t.Errorf("Pending = %d, want 0", got)
				}
				// Three failures within 10 s: one line, the next would count 2 left out.
				lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
				var warn []string
				for _, l := range lines {
					if strings.Contains(l, "fire failed") {
						warn = append(warn, l)
					}
				}
				if len(warn) != 1 || !strings.Contains(warn[0], "key=flaky attempt=1 retry_in=1s suppressed=0") ||
					!strings.Contains(warn[0], `err="stream file is full"`) || !strings.Contains(warn[0], "component=retrytimer") {
					t.Errorf("fire failure log lines = %q, want one for attempt 1", warn)
				}
			})
		})
	}
}

func TestDrain(t *testing.T) {
	tests := []struct {
		name          string
		timeout       time.Duration // 0: no deadline
		blockFire     bool          // Fire of "stuck" waits for ctx
		wantFired     []string
		wantAbandoned int
		wantTook      time.Duration
	}{
		{name: "no deadline", wantFired: []string{"a", "late", "b", "c"}, wantTook: 20 * time.Second},
		{name: "deadline", timeout: 10 * time.Second, wantFired: []string{"a", "late", "b"}, wantAbandoned: 1, wantTook: 10 * time.Second},
		{name: "short deadline", timeout: 3 * time.Second, wantFired: []string{"a"}, wantAbandoned: 3, wantTook: 3 * time.Second},
		{name: "fire stuck at deadline", timeout: 3 * time.Second, blockFire: true, wantAbandoned: 4, wantTook: 3 * time.Second},
	}
	for _, tt := range tests {
		for _, m := range modes {
			t.Run(tt.name+"/"+m.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					r := &recorder{t: t}
					fire := r.fire
					if tt.blockFire {
						fire = func(ctx context.Context, c Copy) error {
							<-ctx.Done()
							return ctx.Err()
						}
					}
					q := mustOpen(t, Options{Dir: m.dir(t), Fire: fire})
					start := time.Now()
					mustSchedule(t, q, "a", start.Add(time.Second))
					mustSchedule(t, q, "b", start.Add(5*time.Second))
					mustSchedule(t, q, "c", start.Add(20*time.Second))
					// Scheduled while Drain runs (a handler still settling).
					go func() {
						time.Sleep(2 * time.Second)
						mustSchedule(t, q, "late", start.Add(4*time.Second))
					}()
					ctx := context.Background()
					if tt.timeout > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tt.timeout)
						defer cancel()
					}
					abandoned, err := q.Drain(ctx)
					if err != nil {
						t.Fatalf("Drain: %v", err)
					}
					if took := time.Since(start); took != tt.wantTook {
						t.Errorf("Drain took %v, want %v", took, tt.wantTook)
					}
					if abandoned != tt.wantAbandoned || q.Pending() != tt.wantAbandoned {
						t.Errorf("Drain abandoned %d (Pending %d), want %d", abandoned, q.Pending(), tt.wantAbandoned)
					}
					var keys []string
					for _, f := range r.all() {
						keys = append(keys, f.key)
					}
					if strings.Join(keys, ",") != strings.Join(tt.wantFired, ",") {
						t.Errorf("fired %v, want %v", keys, tt.wantFired)
					}
					synctest.Wait()
				})
			})
		}
	}
}

// TestStopKeepsSpool stops Run during a Fire and before other copies are
// due: all of them are still in the spool afterwards.
func TestStopKeepsSpool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		started := make(chan struct{})
		q, err := Open(Options{Dir: dir, Fire: func(ctx context.Context, c Copy) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		mustSchedule(t, q, "in-flight", start)
		mustSchedule(t, q, "later", start.Add(time.Minute))
		stop := runQueue(t, q)
		<-started
		if got := q.Pending(); got != 2 {
			t.Errorf("Pending during a fire = %d, want 2", got)
		}
		stop()
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}

		r := &recorder{t: t}
		q = mustOpen(t, Options{Dir: dir, Fire: r.fire})
		if got := q.Pending(); got != 2 {
			t.Fatalf("Pending after restart = %d, want 2", got)
		}
		runQueue(t, q)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		checkFired(t, r.all(), []fired{{"in-flight", start}, {"later", start.Add(time.Minute)}})
	})
}

func TestLifecycleErrors(t *testing.T) {
	if _, err := Open(Options{}); err == nil || err.Error() != "retrytimer: Options.Fire is nil" {
		t.Errorf("Open without Fire: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := Open(Options{Dir: missing, Fire: (&recorder{t: t}).fire}); err == nil ||
		err.Error() != "retrytimer: stat "+missing+": no such file or directory" {
		t.Errorf("Open with a missing directory: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Dir: file, Fire: (&recorder{t: t}).fire}); err == nil ||
		err.Error() != "retrytimer: spool directory "+file+" is not a directory" {
		t.Errorf("Open with a file as directory: %v", err)
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q, err := Open(Options{Dir: m.dir(t), Fire: func(ctx context.Context, c Copy) error { return nil }})
				if err != nil {
					t.Fatal(err)
				}
				far := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
				if err := q.Schedule(Copy{}, far); err == nil || err.Error() != "retrytimer: due time 2300-01-01 00:00:00 +0000 UTC out of range" {
					t.Errorf("Schedule far in the future: %v", err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error)
				go func() { done <- q.Run(ctx) }()
				synctest.Wait()
				if err := q.Run(ctx); err == nil || err.Error() != "retrytimer: Run or Drain is already running" {
					t.Errorf("second Run: %v", err)
				}
				if _, err := q.Drain(ctx); err == nil || err.Error() != "retrytimer: Run or Drain is already running" {
					t.Errorf("Drain during Run: %v", err)
				}
				if err := q.Close(); err == nil || err.Error() != "retrytimer: close while Run or Drain is running" {
					t.Errorf("Close during Run: %v", err)
				}
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
				if err := q.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if err := q.Close(); err != nil {
					t.Errorf("second Close: %v", err)
				}
				if err := q.Schedule(Copy{}, time.Now()); !errors.Is(err, ErrClosed) {
					t.Errorf("Schedule after Close: %v", err)
				}
				if err := q.Run(context.Background()); !errors.Is(err, ErrClosed) {
					t.Errorf("Run after Close: %v", err)
				}
				if _, err := q.Drain(context.Background()); !errors.Is(err, ErrClosed) {
					t.Errorf("Drain after Close: %v", err)
				}
			})
		})
	}
}

func TestRetryDelay(t *testing.T) {
	q := &Queue{backoff: time.Second, maxBackoff: 10 * time.Second}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := q.retryDelay(uint32(i + 1)); got != w {
			t.Errorf("retryDelay(%d) = %v, want %v", i+1, got, w)
		}
	}
	q.maxBackoff = time.Duration(1<<63 - 1)
	if got := q.retryDelay(1 << 31); got != q.maxBackoff {
		t.Errorf("retryDelay(1<<31) = %v, want %v", got, q.maxBackoff)
	}
}

func TestWaitRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{t: t}
		c := testCopy("k0", time.Now(), 0)
		rec, err := encodeSchedule(1, 0, 0, &c)
		if err != nil {
			t.Fatal(err)
		}
		size := int64(len(rec))
		q := mustOpen(t, Options{Fire: r.fire, MaxMemory: 3 * size})
		ctx := t.Context()
		start := time.Now()
		// Three copies fill the bound; each is due a second after the
		// one before.
		for i := range 3 {
			if q.Full() {
				t.Errorf("Full with %d pending of 3", i)
			}
			if err := q.WaitRoom(ctx); err != nil {
				t.Fatalf("WaitRoom with %d pending: %v", i, err)
			}
			mustSchedule(t, q, fmt.Sprintf("k%d", i), start.Add(time.Duration(i+1)*time.Second))
		}
		if !q.Full() {
			t.Error("not Full with 3 pending of 3")
		}
		runQueue(t, q)
		waited := make(chan time.Time)
		go func() {
			if err := q.WaitRoom(ctx); err != nil {
				t.Errorf("WaitRoom: %v", err)
			}
			waited <- time.Now()
		}()
		// The room comes when the first copy has fired, not before.
		if at := <-waited; !at.Equal(start.Add(time.Second)) {
			t.Errorf("WaitRoom returned %v after the start, want 1s (the first fire)", at.Sub(start))
		}

		// A cancelled wait returns its error; a closed queue ErrClosed.
		mustSchedule(t, q, "k3", start.Add(time.Hour))
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		time.Sleep(10 * time.Second) // k1 and k2 fire: k3 and nothing else is pending
		mustSchedule(t, q, "k4", start.Add(time.Hour))
		mustSchedule(t, q, "k5", start.Add(time.Hour))
		if err := q.WaitRoom(wctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitRoom with the bound reached until ctx ends: %v, want context.DeadlineExceeded", err)
		}
	})
}

func TestWaitRoomUnbounded(t *testing.T) {
	for _, tt := range []struct {
		name      string
		spool     bool
		maxMemory int64
	}{{"memory without a bound", false, 0}, {"spool", true, 1}} {
		t.Run(tt.name, func(t *testing.T) {
			// Without MaxMemory, or with a spool, there is always room.
			q := mustOpen(t, Options{Dir: mode{spool: tt.spool}.dir(t), Fire: (&recorder{t: t}).fire, MaxMemory: tt.maxMemory})
			for i := range 5 {
				mustSchedule(t, q, fmt.Sprintf("k%d", i), time.Now().Add(time.Hour))
			}
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if err := q.WaitRoom(ctx); err != nil {
				t.Errorf("WaitRoom: %v, want nil", err)
			}
			if q.Full() {
				t.Error("Full, want never")
			}
		})
	}
}

func TestWaitRoomClosed(t *testing.T) {
	q, err := Open(Options{Fire: (&recorder{t: t}).fire, MaxMemory: 1})
	if err != nil {
		t.Fatal(err)
	}
	mustSchedule(t, q, "k", time.Now().Add(time.Hour))
	done := make(chan error)
	go func() { done <- q.WaitRoom(t.Context()) }()
	time.Sleep(20 * time.Millisecond)
	q.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("WaitRoom on a queue closed meanwhile: %v, want ErrClosed", err)
	}
}

// TestCopyLine: a memory-only queue fires a copy with the Line it was
// scheduled with; one loaded from a spool has none, which no record keeps.
func TestCopyLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var lines []int64
		fire := func(_ context.Context, c Copy) error { lines = append(lines, c.Line); return nil }
		mem := mustOpen(t, Options{Fire: fire})
		spooled := mustOpen(t, Options{Dir: dir, Fire: fire})
		for _, q := range []*Queue{mem, spooled} {
			if err := q.Schedule(Copy{Key: "k", Record: []byte("r"), Line: 7}, time.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		if err := spooled.Close(); err != nil {
			t.Fatal(err)
		}
		reopened := mustOpen(t, Options{Dir: dir, Fire: fire})
		for _, q := range []*Queue{mem, reopened} {
			if _, err := q.Drain(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(lines, []int64{7, 0}) {
			t.Errorf("fired copies of lines %v, want 7 (memory) then 0 (loaded from the spool)", lines)
		}
	})
}

// TestOrigins: the pending copies, loaded from a spool or held in memory,
// grouped by who made them, where they go and Options.Mark; a fired one is
// gone.
func TestOrigins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		var fired []Copy
		fire := func(_ context.Context, c Copy) error { fired = append(fired, c); return nil }
		mark := func(c Copy) bool { return string(c.Record) == "marked" }
		mem := mustOpen(t, Options{Fire: fire, Mark: mark})
		spooled := mustOpen(t, Options{Dir: dir, Fire: fire, Mark: mark})
		copies := []Copy{
			{Subscription: "billing", Stream: "orders", Key: "orders"},
			{Subscription: "audit", Stream: "orders", Key: "orders"},
			{Subscription: "billing", Stream: "orders", Key: "orders", Record: []byte("marked")},
			{Subscription: "billing", Stream: "orders", Key: "orders"},
			{Subscription: "billing", Stream: "orders", Key: "invoices"},
			{Subscription: "billing", Stream: "orders", Key: "orders", Record: []byte("due first")},
		}
		for _, q := range []*Queue{mem, spooled} {
			for i, c := range copies {
				due := time.Now().Add(time.Hour + time.Duration(i)*time.Second)
				if string(c.Record) == "due first" {
					due = time.Now().Add(time.Second)
				}
				if err := q.Schedule(c, due); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := spooled.Close(); err != nil {
			t.Fatal(err)
		}
		reopened := mustOpen(t, Options{Dir: dir, Fire: fire, Mark: mark})
		want := []Origin{
			{Subscription: "audit", Stream: "orders", Key: "orders", Copies: 1},
			{Subscription: "billing", Stream: "orders", Key: "invoices", Copies: 1},
			{Subscription: "billing", Stream: "orders", Key: "orders", Copies: 2},
			{Subscription: "billing", Stream: "orders", Key: "orders", Marked: true, Copies: 1},
		}
		for _, q := range []*Queue{mem, reopened} {
			stop := runQueue(t, q)
			time.Sleep(time.Second) // the copy due first fires
			synctest.Wait()
			stop()
			if got := q.Origins(); !slices.Equal(got, want) {
				t.Errorf("Origins = %+v, want %+v", got, want)
			}
		}
		if len(fired) != 2 || string(fired[0].Record) != "due first" || string(fired[1].Record) != "due first" {
			t.Errorf("fired %+v, want the copy due first of each queue", fired)
		}
	})
}

// TestOriginsLetGo: an origin is let go of with its last copy, fired or
// never scheduled, in memory and in a spool loaded again, so that a queue
// whose copies each name another key does not keep them all.
func TestOriginsLetGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		fire := func(context.Context, Copy) error { return nil }
		spooled := mustOpen(t, Options{Dir: dir, Fire: fire})
		for i := range 3 {
			if err := spooled.Schedule(Copy{Subscription: "s", Key: strconv.Itoa(i)}, time.Now().Add(time.Duration(i+1)*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		stop := runQueue(t, spooled)
		time.Sleep(2 * time.Second) // two fire
		synctest.Wait()
		stop()
		if n := len(spooled.origins.index); n != 1 {
			t.Errorf("%d origins held after two of three copies fired, want 1", n)
		}
		if err := spooled.Close(); err != nil {
			t.Fatal(err)
		}
		reopened := mustOpen(t, Options{Dir: dir, Fire: fire})
		if got := reopened.Origins(); len(got) != 1 || got[0].Key != "2" || len(reopened.origins.index) != 1 {
			t.Errorf("loaded again: Origins %+v, %d held; want the copy of key 2 alone", got, len(reopened.origins.index))
		}
		if _, err := reopened.Drain(t.Context()); err != nil {
			t.Fatal(err)
		}
		if n := len(reopened.origins.index); n != 0 {
			t.Errorf("%d origins held once every copy fired, want none", n)
		}
		if err := reopened.Close(); err != nil {
			t.Fatal(err)
		}
		if err := reopened.Schedule(Copy{Subscription: "s", Key: "late"}, time.Now()); !errors.Is(err, ErrClosed) || len(reopened.origins.index) != 0 {
			t.Errorf("Schedule on a closed queue: %v, %d origins held; want ErrClosed, none", err, len(reopened.origins.index))
		}
	})
}
