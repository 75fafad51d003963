package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/metrics"
)

// openCases are records as a replay reads them, each opened for a handler
// that reads records and for a blind one (discard): 512-byte JSON
// payloads, plain and enveloped with two headers (a trace id and a
// content type).
func openCases() []struct {
	name   string
	record []byte
	blind  bool
} {
	payload := append(append([]byte(`{"id":1234567,"item":"`), bytes.Repeat([]byte("x"), 512-24)...), `"}`...)
	var h envelope.Headers
	h.Set("x-trace-id", []byte("4bf92f3577b34da6a3ce929d0e0e4736"))
	h.Set("content-type", []byte("application/json"))
	enveloped := envelope.Encode(h, payload, false)
	return []struct {
		name   string
		record []byte
		blind  bool
	}{
		{"plain_512B/discard", payload, true},
		{"plain_512B/reads", payload, false},
		{"rs1_two_headers_512B/discard", enveloped, true},
		{"rs1_two_headers_512B/reads", enveloped, false},
	}
}

// openSubscription is a subscription with what open uses: its name and
// one worker's scratch.
func openSubscription() *subscription {
	return &subscription{deliverer: &deliverer{cfg: conf.Subscription{Name: "bench"}}, scratch: make([]scratch, 1)}
}

// TestOpenAllocations: making the delivery of a record allocates nothing
// once a worker's scratch has grown, whether the handler reads records or
// not, and the delivery of each record is its own.
func TestOpenAllocations(t *testing.T) {
	for _, tc := range openCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := openSubscription()
			var d handler.Delivery
			seq := uint64(0)
			allocs := testing.AllocsPerRun(100, func() {
				seq++
				d = handler.Delivery{Seq: seq, Payload: tc.record}
				if !s.open(&d, 0, tc.blind, envelope.Prefixed(tc.record)) {
					t.Fatal("passed over as a foreign copy")
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations per record, want 0", allocs)
			}
			if tc.blind {
				return
			}
			wantH, wantP := envelope.Decode(tc.record)
			wantH.SetSequence(seq)
			if string(headerValue(d.Headers, envelope.SequenceHeader)) != string(headerValue(wantH, envelope.SequenceHeader)) ||
				len(d.Headers) != len(wantH) || !bytes.Equal(d.Payload, wantP) || d.Attempt != 1 {
				t.Errorf("delivery: headers %v, payload %q, attempt %d; want %v, %q, 1", d.Headers, d.Payload, d.Attempt, wantH, wantP)
			}
		})
	}
}

// BenchmarkOpen is the per-record work of a subscription between reading
// a record and handing it to the handler: the envelope checked and
// decoded as the handler needs it, the headers the daemon reads (the
// origin, the retry count), stream-sequence set.
func BenchmarkOpen(b *testing.B) {
	for _, tc := range openCases() {
		b.Run(tc.name, func(b *testing.B) {
			s := openSubscription()
			var d handler.Delivery
			b.SetBytes(int64(len(tc.record)))
			b.ReportAllocs()
			seq := uint64(0)
			for b.Loop() {
				seq++
				d = handler.Delivery{Seq: seq, Payload: tc.record}
				s.open(&d, 0, tc.blind, envelope.Prefixed(tc.record))
			}
		})
	}
}

// TestFinishAllocations: settling an answer that writes no copy, as a
// replay into discard does for every record, allocates nothing.
func TestFinishAllocations(t *testing.T) {
	sc := holdSub(time.Second)
	m := metrics.New(prometheus.NewRegistry()).Subscription(sc.Name, "orders")
	s := &subscription{deliverer: newDeliverer(sc, handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome { return ack }),
		fileTransport, &fakeCopies{}, m, slog.New(slog.DiscardHandler))}
	d := settleDelivery(1, nil, nil)
	s.finish(t.Context(), d, ack) // the first ack is logged
	if allocs := testing.AllocsPerRun(100, func() { s.finish(t.Context(), d, ack) }); allocs != 0 {
		t.Errorf("%v allocations per record, want 0", allocs)
	}
}

// stuckCopies fails the first fails copies it is given, each with ENOSPC,
// and records when each was tried.
type stuckCopies struct {
	fakeCopies
	fails int
	tried []time.Time
}

func (f *stuckCopies) publish(ctx context.Context, key string, record []byte) error {
	f.tried = append(f.tried, time.Now())
	if len(f.tried) <= f.fails {
		return syscall.ENOSPC
	}
	return f.fakeCopies.publish(ctx, key, record)
}

// TestFinishCopyRetryCadence: a copy that cannot be written is tried again
// after each backoff step, but at most copyRetryMax apart, however long
// the steps are; its record is final once it is written, and the
// subscription is unhealthy until then.
func TestFinishCopyRetryCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := settleSub{maxAttempts: 5, backoff: []time.Duration{time.Second, 30 * time.Second, 2 * time.Minute}}.config()
		all := metrics.New(prometheus.NewRegistry())
		m := all.Subscription(sc.Name, "orders")
		copies := &stuckCopies{fails: 4}
		s := &subscription{
			deliverer: newDeliverer(sc, handler.HandlerFunc(func(context.Context, *handler.Delivery) handler.Outcome { return retry }),
				fileTransport, copies, m, slog.New(slog.DiscardHandler)),
			health: &subHealth{m: m},
		}
		start := time.Now()
		var final bool
		go func() { final = s.finish(t.Context(), settleDelivery(1, nil, []byte("a")), retry) }()
		time.Sleep(time.Second + 3*copyRetryMax - time.Millisecond)
		synctest.Wait()
		if all.Health().Err() == nil {
			t.Error("healthy while the copy cannot be written")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		var after []time.Duration
		for _, at := range copies.tried {
			after = append(after, at.Sub(start))
		}
		want := []time.Duration{0, time.Second, time.Second + copyRetryMax, time.Second + 2*copyRetryMax, time.Second + 3*copyRetryMax}
		if !slices.Equal(after, want) {
			t.Fatalf("copy tried after %v, want %v", after, want)
		}
		if !final || len(copies.copies) != 1 {
			t.Fatalf("finish returned %v with %d copies written, want true and 1", final, len(copies.copies))
		}
		if err := all.Health().Err(); err != nil {
			t.Errorf("unhealthy once the copy is written: %v", err)
		}
	})
}
