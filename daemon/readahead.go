package daemon

import (
	"cmp"
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/cpu"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// Read-ahead bounds: a batch holds at most aheadRecords records and, but
// for a single larger payload, aheadBytes of payload; aheadBatches batches
// exist per subscription (one filled, one waiting, one handled). A batch
// starts empty and grows to what it is given to hold, so that a quiet
// subscription holds little; the memory it grew to is used again.
const (
	aheadRecords = 1024
	aheadBytes   = 256 << 10
	aheadBatches = 3
)

// readAhead reads a follower's records on a goroutine of its own, ahead of
// the subscription that handles them: reading and checking the frames (a
// checksum per payload) runs on one core while the handling runs on
// another. Records travel in batches, their payloads copied into the
// batch's memory, which is used again once the batch was handled. A batch
// goes when it is full (the next record would take it past a bound), when
// the next record is of another file, when the follower is about to wait
// for the file to change, and at the follower's end or error, so that a
// record read is handed on at once when the file is quiet. (A read that
// hangs, on a stuck disk, holds back the records read before it in the
// batch; the watchdog learns of the stall from the follower.)
type readAhead struct {
	follower *tail.Follower
	full     chan *aheadBatch // to the subscription, in file order
	free     chan *aheadBatch // back to the reader
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// The reader's side: its context, and the batch it fills (nil once it
	// stopped).
	readCtx context.Context
	filling *aheadBatch

	// readOn is how the subscription asks the reader to read on after
	// the end of a replay's data.
	readOn chan struct{}
	// lookEvery is how often the reader looks at the path
	// (tail.Follower.Look) while it waits for a batch to fill: the
	// follower's poll interval.
	lookEvery time.Duration

	// heldFor is the file the reader last took a descriptor of
	// (aheadBatch.held). Used by the reader alone.
	heldFor streamfile.Identity
	// held is, in file order, descriptors of the files of the records the
	// subscription took (tail.Follower.Hold), kept until it moves past
	// them (release): the file its position is in stays open even when
	// a rotation removed it from the directory, for a subscription
	// started in its place by a reload to read on (tail.Options.Held).
	heldMu sync.Mutex
	held   []heldFile

	// The subscription's side, on cache lines of its own: it changes with
	// every record taken, and a cache line it shared with what the reader
	// reads for every record would pass from core to core for each record.
	_ cpu.CacheLinePad
	// The batch it reads, and where; whether it took a record since it
	// last asked the reader to read on (or since the start).
	cur      *aheadBatch
	next     int
	rec      tail.Record
	prefixed bool // rec's
	took     bool
	_        cpu.CacheLinePad
}

// aheadBatch is records of one file, in file order, then the follower's
// error if it ended there.
type aheadBatch struct {
	_       cpu.CacheLinePad
	file    streamfile.Identity
	records []streamfile.Record
	// prefixed says, for each record, whether its payload starts with an
	// envelope prefix (envelope.Prefixed), found while the reader has the
	// payload in its core's cache: the subscription need not look at a
	// plain record's payload, in the other core's cache, to know it is
	// not an envelope.
	prefixed []bool
	payload  []byte   // the records' payloads
	held     *os.File // a descriptor of file, in the first batch of it
	err      error
	_        cpu.CacheLinePad
}

// heldFile is a descriptor of a stream file a subscription read records of.
type heldFile struct {
	id streamfile.Identity
	f  *os.File
}

// followAhead opens a follower with opts, to be read ahead once started.
func followAhead(opts tail.Options) (*readAhead, error) {
	ra := &readAhead{
		full:   make(chan *aheadBatch, aheadBatches),
		free:   make(chan *aheadBatch, aheadBatches),
		readOn: make(chan struct{}, 1),
	}
	for range aheadBatches {
		ra.free <- &aheadBatch{}
	}
	opts.OnWait = ra.flush
	ra.lookEvery = cmp.Or(opts.PollInterval, tail.DefaultPollInterval)
	var err error
	ra.follower, err = tail.New(opts)
	if err != nil {
		return ra, err
	}
	// The file the follower starts in, the one of the position, is held
	// from the start: a subscription stopped by a reload before it took a
	// record of it (a quiet file, rotated away) still hands it over.
	if pos := ra.follower.Position(); pos.Offset > 0 {
		if f := ra.follower.Hold(); f != nil {
			ra.held, ra.heldFor = append(ra.held, heldFile{id: pos.File, f: f}), pos.File
		}
	}
	return ra, nil
}

// start starts reading the follower, until ctx ends or Close is called.
func (ra *readAhead) start(ctx context.Context) {
	ra.readCtx, ra.cancel = context.WithCancel(ctx)
	ra.filling = <-ra.free
	ra.wg.Go(ra.read)
}

// stop stops the reader, if it was started, and waits for it.
func (ra *readAhead) stop() {
	if ra.cancel != nil {
		ra.cancel()
		ra.wg.Wait()
	}
}

// read is the reader's loop.
func (ra *readAhead) read() {
	ctx, fl := ra.readCtx, ra.follower
	for {
		rec, err := fl.Next(ctx)
		if ra.filling == nil {
			return // stopped while handing on a batch
		}
		if err != nil {
			ra.filling.err = err
			ra.full <- ra.filling // room: every batch not on ra.free fits
			ra.filling = nil
			if !errors.Is(err, io.EOF) {
				return
			}
			// Perhaps a replay's end: read on if the subscription asks
			// to (Next), once it took every record read.
			select {
			case <-ra.readOn:
			case <-ctx.Done():
				return
			}
			fl.ReadOn() // or Next ends again
			select {
			case ra.filling = <-ra.free:
			case <-ctx.Done():
				return
			}
			continue
		}
		b := ra.filling
		if len(b.records) > 0 && (b.file != rec.File || len(b.records) == aheadRecords ||
			len(b.payload)+len(rec.Payload) > aheadBytes) {
			if !ra.handOn() {
				return
			}
			b = ra.filling
		}
		b.file = rec.File
		if rec.File != ra.heldFor {
			b.held, ra.heldFor = fl.Hold(), rec.File
		}
		r := *rec.Record
		// When the payloads outgrow b.payload, it moves on to a new array:
		// the payloads already in the batch stay in the old one, which
		// nothing writes again.
		start := len(b.payload)
		b.payload = append(grow(b.payload, len(r.Payload), 4<<10, aheadBytes), r.Payload...)
		r.Payload = b.payload[start:len(b.payload):len(b.payload)]
		b.records = append(grow(b.records, 1, 16, aheadRecords), r)
		b.prefixed = append(grow(b.prefixed, 1, 16, aheadRecords), envelope.Prefixed(r.Payload))
	}
}

// flush hands on the batch being filled, if it holds records: the
// follower's OnWait, called before it waits for the file to change.
func (ra *readAhead) flush() {
	if ra.filling != nil && len(ra.filling.records) > 0 {
		ra.handOn()
	}
}

// handOn hands on the batch being filled and takes an empty one; false
// when the reader was stopped first. While it waits for the subscription
// to free a batch, it looks at the path (tail.Follower.Look) at each
// notification and every lookEvery: a subscription that lags keeps its
// follower from looking at the path as it does when it waits for the file
// to grow.
func (ra *readAhead) handOn() bool {
	ra.full <- ra.filling // room: every batch not on ra.free fits
	select {
	case ra.filling = <-ra.free:
		return true
	default:
	}
	ticker := time.NewTicker(ra.lookEvery)
	defer ticker.Stop()
	woke := false
	defer func() {
		if woke {
			ra.follower.Rewake()
		}
	}()
	wakeups := ra.follower.Wakeups()
	for {
		select {
		case ra.filling = <-ra.free:
			return true
		case <-wakeups:
			woke = true
			ra.follower.Look()
		case <-ticker.C:
			ra.follower.Look()
		case <-ra.readCtx.Done():
			ra.filling = nil
			return false
		}
	}
}

// Next returns the next record, as [tail.Follower.Next] does: it is valid
// until the next call, and the follower's error ends the records. Once ctx
// ended it returns ctx's error, even with records read ahead: they are
// read again after a restart.
func (ra *readAhead) Next(ctx context.Context) (*tail.Record, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	default:
	}
	for ra.cur == nil || ra.next == len(ra.cur.records) {
		if b := ra.cur; b != nil {
			readOn := errors.Is(b.err, io.EOF) && ra.took
			if b.err != nil && !readOn {
				return nil, b.err
			}
			if readOn {
				// The end of a replay's data as the reader found it: the
				// records handled since may have appended copies, which
				// the replay reads as it would have without reading ahead
				// (tail.Follower.ReadOn). Another end with nothing read
				// since is the end. Inline, every record taken is handled
				// by now; with workers or batches, records still in hand
				// may append copies after the replay ended, as they could
				// without reading ahead.
				ra.took = false
				ra.readOn <- struct{}{}
			}
			clear(b.records) // not to keep arrays b.payload outgrew, or the one dropped below
			b.records, b.prefixed, b.payload, b.err = b.records[:0], b.prefixed[:0], b.payload[:0], nil
			if cap(b.payload) > 2*aheadBytes {
				b.payload = nil // it held a payload larger than a batch's bound
			}
			ra.free <- b
			ra.cur = nil
		}
		select {
		case ra.cur = <-ra.full:
			ra.next = 0
			if f := ra.cur.held; f != nil {
				ra.cur.held = nil
				ra.heldMu.Lock()
				ra.held = append(ra.held, heldFile{id: ra.cur.file, f: f})
				ra.heldMu.Unlock()
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ra.rec.Record, ra.rec.File = &ra.cur.records[ra.next], ra.cur.file
	ra.prefixed = ra.cur.prefixed[ra.next]
	ra.next++
	ra.took = true
	return &ra.rec, nil
}

// Prefixed reports whether the payload of the record Next returned last
// starts with an envelope prefix (envelope.Prefixed), as the reader found
// it: false says the record is plain without a look at its payload.
func (ra *readAhead) Prefixed() bool { return ra.prefixed }

// Close stops the reader, if it was started, waits for it, and closes the
// follower and the files held, but for those keep took.
func (ra *readAhead) Close() {
	ra.stop()
	ra.follower.Close()
	if b := ra.filling; b != nil && b.held != nil {
		b.held.Close()
	}
	for len(ra.full) > 0 {
		if b := <-ra.full; b.held != nil {
			b.held.Close()
		}
	}
	ra.release(func(streamfile.Identity) bool { return false })
}

// release closes the files held that keep does not keep: the subscription
// moved past them, or is done with them.
func (ra *readAhead) release(keep func(streamfile.Identity) bool) {
	ra.heldMu.Lock()
	defer ra.heldMu.Unlock()
	ra.held = slices.DeleteFunc(ra.held, func(h heldFile) bool {
		if keep(h.id) {
			return false
		}
		h.f.Close()
		return true
	})
}

// keep stops the reader and returns the held files a subscription started
// in its place by a reload reads (tail.Options.Held and HeldAfter), which
// the caller then owns: the held file id, and the files read after it, in
// the order read: those of the records taken since, of the batches read
// ahead, and those the follower reads and keeps (tail.Follower.HoldAhead).
// A file given twice is taken once by the follower. It closes the other
// held files; without file id held, it returns none.
func (ra *readAhead) keep(id streamfile.Identity) heldFiles {
	ra.stop()
	ra.heldMu.Lock()
	defer ra.heldMu.Unlock()
	var h heldFiles
	for _, hf := range ra.held {
		switch {
		case h.pos == nil && hf.id == id:
			h.pos = hf.f
		case h.pos != nil:
			h.after = append(h.after, hf.f)
		default:
			hf.f.Close()
		}
	}
	ra.held = nil
	if h.pos == nil {
		return h
	}
	for len(ra.full) > 0 {
		if b := <-ra.full; b.held != nil {
			h.after = append(h.after, b.held)
			b.held = nil
		}
	}
	if b := ra.filling; b != nil && b.held != nil {
		h.after = append(h.after, b.held)
		b.held = nil
	}
	h.after = append(h.after, ra.follower.HoldAhead()...)
	return h
}

// heldFiles is the file of a subscription's position, kept open after its
// run, and the files it had read after it, for the subscription a reload
// starts in its place (tail.Options.Held and HeldAfter).
type heldFiles struct {
	pos   *os.File
	after []*os.File
}

// Close closes the files.
func (h heldFiles) Close() {
	if h.pos != nil {
		h.pos.Close()
	}
	for _, f := range h.after {
		f.Close()
	}
}

// grow returns s with room for n more elements: a batch's memory starts
// at small, enough for a quiet file's records, and grows at once to bound
// when it has to grow again, for a subscription catching up (growing a
// little at a time would leave several times a batch's memory behind as
// garbage on the way).
func grow[E any](s []E, n, small, bound int) []E {
	need := len(s) + n
	switch {
	case need <= cap(s):
		return s
	case cap(s) == 0:
		return slices.Grow(s, max(need, small)-len(s))
	}
	return slices.Grow(s, max(need, bound)-len(s))
}
