package offsets

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
)

// TestTrackerModel hands out records and settles them in random orders,
// with random windows, and checks after every step that Committable is the
// end of the settled prefix a naive model computes, that SettledAhead is
// the settled records after it, and that Begin waits exactly when the
// model's window is full.
func TestTrackerModel(t *testing.T) {
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for seed := range uint64(1000) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		from := Mark{Offset: rng.Int64N(1000), Seq: rng.Uint64N(1000)}
		window := 1 + rng.IntN(16)
		n := 1 + rng.IntN(200)
		tr := NewTracker(from, window)

		type record struct {
			start   int64
			end     int64
			seq     uint64
			tag     uint64
			ticket  Ticket
			settled bool
		}
		var records []record
		var unsettled []int // indexes into records, in no order
		prefix := 0         // records[:prefix] are settled
		lastEnd := from.Offset
		for prefix < n {
			full := len(records)-prefix == window
			if len(records) < n && (len(unsettled) == 0 || rng.IntN(3) > 0) {
				start := lastEnd + rng.Int64N(3) // gaps: frames passed over
				end := start + 1 + rng.Int64N(100)
				// A cancelled ctx: Begin must not wait unless the window is full.
				seq, tag := rng.Uint64(), rng.Uint64()
				ticket, err := tr.BeginTagged(cancelled, start, end, seq, tag)
				if full {
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("seed %d: Begin with a full window of %d: %v, want to wait", seed, window, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("seed %d: Begin: %v", seed, err)
				}
				records = append(records, record{start: start, end: end, seq: seq, tag: tag, ticket: ticket})
				unsettled = append(unsettled, len(records)-1)
				lastEnd = end
			} else if len(unsettled) > 0 {
				k := rng.IntN(len(unsettled))
				i := unsettled[k]
				unsettled[k] = unsettled[len(unsettled)-1]
				unsettled = unsettled[:len(unsettled)-1]
				if err := tr.Settle(records[i].ticket); err != nil {
					t.Fatalf("seed %d: Settle: %v", seed, err)
				}
				records[i].settled = true
				for prefix < len(records) && records[prefix].settled {
					prefix++
				}
			}
			want := from
			if prefix > 0 {
				want = Mark{Offset: records[prefix-1].end, Seq: records[prefix-1].seq}
			}
			if got := tr.Committable(); got != want {
				t.Fatalf("seed %d: after %d records, %d settled in a prefix: Committable %+v, want %+v",
					seed, len(records), prefix, got, want)
			}
			var ahead []Span
			for _, r := range records[prefix:] {
				if r.settled {
					ahead = append(ahead, Span{Start: r.start, End: r.end, Seq: r.seq, Tag: r.tag})
				}
			}
			if got := tr.SettledAhead(); !slices.Equal(got, ahead) {
				t.Fatalf("seed %d: SettledAhead %v, want %v", seed, got, ahead)
			}
		}
	}
}

// TestTrackerWaits checks that Begin waits while the window is full, until
// the oldest record settles or ctx ends.
func TestTrackerWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := NewTracker(Mark{}, 2)
		first, _ := tr.Begin(t.Context(), 0, 10, 1)
		second, _ := tr.Begin(t.Context(), 10, 20, 2)

		begun := make(chan error)
		go func() {
			_, err := tr.Begin(t.Context(), 20, 30, 3)
			begun <- err
		}()
		synctest.Wait()
		if err := tr.Settle(second); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case err := <-begun:
			t.Fatalf("Begin returned (%v) while the oldest record was in flight", err)
		default:
		}
		if err := tr.Settle(first); err != nil {
			t.Fatal(err)
		}
		if err := <-begun; err != nil {
			t.Fatal(err)
		}
		if got, want := tr.Committable(), (Mark{Offset: 20, Seq: 2}); got != want {
			t.Fatalf("Committable %+v, want %+v", got, want)
		}

		if _, err := tr.Begin(t.Context(), 30, 40, 4); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			_, err := tr.Begin(ctx, 40, 50, 5)
			begun <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-begun; !errors.Is(err, context.Canceled) {
			t.Fatalf("Begin after cancel: %v", err)
		}
	})
}

func TestTrackerErrors(t *testing.T) {
	tr := NewTracker(Mark{Offset: 100, Seq: 7}, 4)
	ctx := t.Context()
	first, err := tr.Begin(ctx, 100, 110, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"overlap", second(tr.Begin(ctx, 105, 120, 9)), "offsets: tracker: record [105, 120) is out of file order after offset 110"},
		{"empty record", second(tr.Begin(ctx, 110, 110, 9)), "offsets: tracker: record [110, 110) is out of file order after offset 110"},
		{"never handed out", tr.Settle(first + 1), "offsets: tracker: settle 1: never handed out"},
		{"settled once", tr.Settle(first), ""},
		{"settled twice", tr.Settle(first), "offsets: tracker: settle 0: settled already"},
	} {
		got := ""
		if tc.err != nil {
			got = tc.err.Error()
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	before := NewTracker(Mark{Offset: 100}, 1)
	if _, err := before.Begin(ctx, 50, 60, 1); err == nil {
		t.Error("Begin before the Tracker's start: no error")
	}
	a, _ := tr.Begin(ctx, 110, 120, 9)
	b, _ := tr.Begin(ctx, 120, 130, 10)
	if err := tr.Settle(b); err != nil {
		t.Fatal(err)
	}
	if err := tr.Settle(b); err == nil || err.Error() != "offsets: tracker: settle 2: settled already" {
		t.Errorf("second Settle of a record behind an unsettled one: %v", err)
	}
	if err := tr.Settle(a); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.Committable(), (Mark{Offset: 130, Seq: 10}); got != want {
		t.Errorf("Committable %+v, want %+v", got, want)
	}
}

func second[T any](_ T, err error) error { return err }

// BenchmarkTracker measures handing out and settling one record, with
// eight in flight settled out of order.
func BenchmarkTracker(b *testing.B) {
	const inFlight = 8
	tr := NewTracker(Mark{}, 64)
	ctx := context.Background()
	b.ReportAllocs()
	var offset int64
	var i Ticket
	for b.Loop() {
		ticket, err := tr.Begin(ctx, offset, offset+100, uint64(i))
		if err != nil {
			b.Fatal(err)
		}
		offset += 100
		if ticket >= inFlight {
			// Settles each pair in reverse: 1, 0, 3, 2, ...
			if err := tr.Settle((ticket - inFlight) ^ 1); err != nil {
				b.Fatal(err)
			}
		}
		i++
	}
	if tr.Committable().Offset == 0 && i > 2*inFlight {
		b.Fatal("the watermark never moved")
	}
}

func TestTrackerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := NewTracker(Mark{}, 8)
		first, _ := tr.Begin(t.Context(), 0, 10, 1)
		second, _ := tr.Begin(t.Context(), 10, 20, 2)
		done := make(chan error)
		go func() { done <- tr.Wait(t.Context()) }()
		synctest.Wait()
		tr.Settle(second)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Wait returned (%v) with a record in flight", err)
		default:
		}
		tr.Settle(first)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		tr.Begin(ctx, 20, 30, 3)
		cancel()
		if err := tr.Wait(ctx); err != context.Canceled {
			t.Fatalf("Wait with a cancelled context = %v", err)
		}
	})
}

// TestTrackerContinued: a Tracker continued for the next file hands out
// tickets after the first one's, each tells its own tickets (Owns), and
// records of both settle in any order, each Tracker's position its own.
func TestTrackerContinued(t *testing.T) {
	first := NewTracker(Mark{Offset: 10}, 4)
	a, err := first.Begin(t.Context(), 10, 20, 1)
	if err != nil {
		t.Fatal(err)
	}
	next := first.Continued(Mark{Offset: 128}, 4)
	b, err := next.Begin(t.Context(), 128, 140, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b <= a || !next.Owns(b) || next.Owns(a) || !first.Owns(a) {
		t.Fatalf("tickets %d then %d: the continued Tracker owns the second only", a, b)
	}
	if err := next.Settle(b); err != nil {
		t.Fatal(err)
	}
	if first.Settled() || !next.Settled() || next.Committable() != (Mark{Offset: 140, Seq: 1}) {
		t.Fatalf("after the second record settled: first settled %v, next settled %v at %+v", first.Settled(), next.Settled(), next.Committable())
	}
	if err := first.Settle(a); err != nil {
		t.Fatal(err)
	}
	if !first.Settled() || first.Committable() != (Mark{Offset: 20, Seq: 1}) {
		t.Fatalf("after the first record settled: settled %v at %+v", first.Settled(), first.Committable())
	}
}
