package daemon

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/offsets"
)

// batching is how a subscription whose handler takes batches gathers the
// records it reads into them: a batch is handed to a worker once it holds
// maxRecords records or maxBytes of payload and headers, or linger after its
// first record was read. The subscription's concurrency then counts batches
// in flight.
type batching struct {
	handler    handler.BatchHandler
	maxRecords int
	maxBytes   int
	linger     time.Duration
	// free holds batches delivered, for the next ones: their memory is
	// used again instead of allocated for each batch.
	free sync.Pool
}

// newBatching returns the batching of subscription sc with handler h, or
// nil when it sends no batches: its handler table does not set
// batch_max_records, or h takes no batches (a Go handler given in its
// place that is no [handler.BatchHandler]).
func newBatching(sc conf.Subscription, h handler.Handler) *batching {
	bh, ok := h.(handler.BatchHandler)
	if !ok || sc.Handler.BatchMaxRecords <= 0 {
		return nil
	}
	b := &batching{
		handler:    bh,
		maxRecords: sc.Handler.BatchMaxRecords,
		maxBytes:   cmp.Or(sc.Handler.BatchMaxBytes, conf.DefaultBatchMaxBytes),
		linger:     time.Duration(cmp.Or(sc.Handler.BatchLinger, conf.DefaultBatchLinger)),
	}
	b.free.New = func() any {
		return &batch{ds: make([]handler.Delivery, 0, b.maxRecords), tickets: make([]offsets.Ticket, 0, b.maxRecords)}
	}
	return b
}

// batch is records handed out together, with their tickets, and the
// outcomes the handler gives them.
type batch struct {
	ds      []handler.Delivery
	tickets []offsets.Ticket
	outs    []handler.Outcome
	bytes   int // of payload and headers
	// settling is memory for the tickets of the records settled together
	// (settleAnswered).
	settling []offsets.Ticket
}

// recordBytes is what a delivery counts against batch_max_bytes: its
// payload and its headers' names and values.
func recordBytes(d *handler.Delivery) int {
	n := len(d.Payload)
	for _, e := range d.Headers {
		n += len(e.Name) + len(e.Value)
	}
	return n
}

// window is the size of the subscription's tracker window: trackerWindow,
// and with batches at least room for the records of a batch in each
// worker, one being gathered, and one more in the queue to the gatherer,
// so that reading waits for settlements only when every worker is busy.
func (s *subscription) window() int {
	if s.batches == nil {
		return trackerWindow
	}
	return max(trackerWindow, (max(s.cfg.Concurrency, 1)+2)*s.batches.maxRecords)
}

// runBatches starts, in wg, the goroutines of a subscription that sends
// batches: one gathers the records the reader hands out on jobs into
// batches, and the workers deliver them; a worker that fails gives its
// error to failRun, which ends ctx, and gathering stops with it.
func (s *subscription) runBatches(ctx, hctx context.Context, wg *sync.WaitGroup, jobs <-chan job, failRun func(error), workers int) {
	batches := make(chan *batch)
	wg.Go(func() { s.gather(ctx, jobs, batches) })
	startWorkers(wg, workers, batches, failRun, func(b *batch, w int) error {
		return s.deliverBatch(ctx, hctx, b, w)
	})
}

// gather reads the records handed out on jobs into batches for the
// workers, and closes batches when it returns. When jobs closes it sends
// the batch it holds, unless ctx ended (the subscription stops: those
// records stay unsettled, and are read again after a restart). It returns
// at once when ctx ends.
func (s *subscription) gather(ctx context.Context, jobs <-chan job, batches chan<- *batch) {
	defer close(batches)
	lim := s.batches
	linger := time.NewTimer(lim.linger)
	linger.Stop()
	defer linger.Stop()
	var b *batch
	// send hands b to a worker; false when gathering must stop.
	send := func() bool {
		linger.Stop()
		select {
		case batches <- b:
			b = nil
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		select {
		case j, ok := <-jobs:
			if !ok {
				if b != nil && ctx.Err() == nil {
					send()
				}
				return
			}
			n := recordBytes(&j.d)
			if b != nil && b.bytes+n > lim.maxBytes && !send() {
				return
			}
			if b == nil {
				b = lim.free.Get().(*batch)
				linger.Reset(lim.linger)
			}
			b.ds = append(b.ds, j.d)
			b.tickets = append(b.tickets, j.ticket)
			b.bytes += n
			if (len(b.ds) >= lim.maxRecords || b.bytes >= lim.maxBytes) && !send() {
				return
			}
		case <-linger.C:
			if b != nil && !send() {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// deliverBatch hands b to the batch handler on worker w until each of its
// records has an answer (answerBatch: failed deliveries are held in place),
// and settles the records each delivery answered at once (settleAnswered),
// while the others are held. When the subscription stops while records
// are held, they stay unsettled, and are read again after a restart.
func (s *subscription) deliverBatch(ctx, hctx context.Context, b *batch, w int) error {
	handed := monoNow()
	s.workers[w].handed.Store(handed)
	s.workers[w].batched.Store(int32(len(b.ds)))
	defer func() {
		s.workers[w].handed.Store(0)
		s.workers[w].batched.Store(0)
	}()
	b.outs = slices.Grow(b.outs[:0], len(b.ds))[:len(b.ds)]
	err := s.answerBatch(hctx, ctx.Done(), s.batches.handler, b.ds, b.outs, w, handed, func(answered []int) {
		s.settleAnswered(hctx, b, answered, w)
	})
	if err != nil && !errors.Is(err, errStopped) {
		return err
	}
	clear(b.ds) // not to keep the payloads alive
	b.ds, b.tickets, b.bytes = b.ds[:0], b.tickets[:0], 0
	s.batches.free.Put(b)
	return nil
}

// settleAnswered settles the records of b at answered (indices in b.ds, in
// order; nil for all), whose outcomes are in b.outs, as deliver settles
// one: each is finished, in order, and then their tickets are settled
// together. When hctx ends before a copy could be written, that record
// and those after it stay unsettled. Worker w's count of the records it
// has handed out then leaves those settled out.
func (s *subscription) settleAnswered(hctx context.Context, b *batch, answered []int, w int) {
	n := len(b.ds)
	if answered != nil {
		n = len(answered)
	}
	tickets := slices.Grow(b.settling[:0], n) // one allocation for a new batch
	for j := range n {
		i := j
		if answered != nil {
			i = answered[j]
		}
		if !s.finish(hctx, &b.ds[i], b.outs[i]) {
			break
		}
		tickets = append(tickets, b.tickets[i])
	}
	if len(tickets) == 0 {
		return
	}
	s.settled(tickets...)
	b.settling = tickets[:0]
	ws := &s.workers[w]
	left := ws.batched.Load() - int32(len(tickets))
	if left == 0 {
		ws.handed.Store(0) // first: batched 0 with handed set counts one
	}
	ws.batched.Store(left)
}
