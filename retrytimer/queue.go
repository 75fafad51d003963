package retrytimer

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/internal/wakeup"
)

// Copy is a record to be written back to a stream once it is due.
type Copy struct {
	// Stream names the stream the copy is written to: a configured stream
	// name or a file path. The package does not interpret it.
	Stream string
	// Key is the stream key the copy is published under.
	Key string
	// Record is the bytes to write, in their final form (the caller has
	// enveloped them if they need it). The package does not interpret them.
	Record []byte
	// Subscription names who made the copy, for the caller's accounting
	// when it fires; "" in copies of spools written before it was kept.
	// The package does not interpret it.
	Subscription string
	// Line is the stdin line a pipe stage's copy comes from, for its
	// accounting when the copy fires. A spool does not keep it: it is 0 in
	// the copies loaded from one (a stage has none). The package does not
	// interpret it.
	Line int64
}

// FireFunc publishes a due copy. A [Queue] calls it from the goroutine that
// runs [Queue.Run] or [Queue.Drain], one copy at a time; c is the callee's to
// keep. A nil error means the copy was written: it is then marked done. An
// error leaves the copy pending, to be tried again after a backoff. ctx is
// the one given to Run or Drain: when it is done, FireFunc should give up
// soon, and the copy stays pending.
type FireFunc func(ctx context.Context, c Copy) error

// Options configures a [Queue].
type Options struct {
	// Dir is the directory of the durable spool, which must exist. Empty
	// means memory-only: nothing is written to disk and pending copies die
	// with the process.
	Dir string
	// Fire publishes due copies. Required.
	Fire FireFunc
	// Logger receives spool events and failed fires (at most one line per
	// 10 s, with the number left out). Nil discards them.
	Logger *slog.Logger
	// RetryBackoff is the delay before the second try of a copy whose Fire
	// failed; each further failure doubles it, up to MaxRetryBackoff.
	// Zero or negative means 1s.
	RetryBackoff time.Duration
	// MaxRetryBackoff bounds the delay between tries. Zero or negative
	// means 1m; a value below RetryBackoff is raised to it.
	MaxRetryBackoff time.Duration
	// CompactMinBytes is how many bytes of fired copies the spool must
	// hold, besides more than it holds of pending ones, before it is
	// compacted. Zero or negative means 64 KiB.
	CompactMinBytes int64
	// Now is the wall clock that due times are read against. Nil means
	// [time.Now]. Tests set it to a clock that jumps.
	Now func() time.Time
	// MaxMemory bounds the bytes of pending copies a memory-only queue
	// holds, as [Queue.WaitRoom] waits for it: each copy counts its
	// Record, Stream and Key and 49 bytes of framing. Zero means no bound.
	MaxMemory int64
	// Durable makes the copies fired so far durable where Fire wrote them
	// (the daemon syncs its stream files). With a spool, a fired copy is
	// recorded as done only once Durable returned nil after it, so that a
	// power loss cannot keep the record of a copy and lose the copy; the
	// copies that fire together share one call. While it fails, they stay
	// pending in the spool (fired again after a restart). Nil means a copy
	// is durable when Fire returns.
	Durable func() error
	// Mark, if set, tells copies apart in [Queue.Origins]: it is called
	// with each copy scheduled or loaded from the spool, whose Record it
	// must not keep, and reports whether the copy is marked. The daemon
	// marks the copies that carry their maker's name.
	Mark func(Copy) bool
	// Stuck, if set, is told when no copy fires any more because the
	// spool cannot record the copies fired as done (a full disk: err),
	// and when it can again (nil), for a health check.
	Stuck func(err error)
}

// doneBatch is the most copies fired before their done records are written.
const doneBatch = 256

// Defaults for [Options].
const (
	DefaultRetryBackoff    = time.Second
	DefaultMaxRetryBackoff = time.Minute
	DefaultCompactMinBytes = 64 << 10
)

// scheduleSlack is how far the wall clock may seem to have stepped back
// between a caller's reading and Schedule's before the due time is moved:
// the wall and monotonic readings of one time.Now differ by nanoseconds.
const scheduleSlack = time.Millisecond

// ErrClosed is returned by the methods of a closed [Queue].
var ErrClosed = errors.New("retrytimer: queue closed")

// Due times must fit in int64 Unix nanoseconds.
var (
	minDue = time.Unix(0, math.MinInt64)
	maxDue = time.Unix(0, math.MaxInt64)
)

// Queue holds copies until they are due and then hands them to a
// [FireFunc], in due order (ties in schedule order). See the package
// documentation for the spool and the concurrency contract.
type Queue struct {
	fire       FireFunc
	durable    func() error
	stuck      func(error)
	log        *slog.Logger
	backoff    time.Duration
	maxBackoff time.Duration
	compactMin int64
	now        func() time.Time
	sp         *spool // nil in memory-only mode; set once by Open
	wake       chan struct{}

	// syncMu serializes fsyncs of the spool with compaction and Close,
	// which replace or close its file. It is taken before mu.
	syncMu sync.Mutex
	synced uint64 // spool records known durable; guarded by syncMu

	mu           sync.Mutex
	h            entryHeap
	nextID       uint64
	inflight     int   // entries popped for a Fire that has not returned
	err          error // first spool failure: nothing is written after it
	running      bool  // Run or Drain is running
	closed       bool
	compactFloor int64  // dead bytes needed for the next compaction
	latest       int64  // the latest reading of the clock, Unix ns; no entry is scheduled after it
	memBytes     int64  // bytes of the records of pending entries (memory-only mode)
	scheduled    uint64 // spool records up to the last schedule record (see recordDone)
	maxMemory    int64
	freed        wakeup.Signal // woken when memBytes drops or the queue closes
	origins      *originTable  // of the entries (entry.origin)

	// Owned by the goroutine in Run or Drain.
	fireLog    ratelog.Limiter // of fire failures
	durableLog ratelog.Limiter // of Durable failures
	// doneTrouble: the spool cannot record fired copies as done.
	doneTrouble ratelog.Trouble
	reclaimLog  ratelog.Line // of failures to write a removed spool again
	undone      []uint64     // ids fired whose done records wait for Durable (spool mode); changed under mu
	held        bool         // Durable failed, or writing done records: no copy fires until they pass
}

// Open returns a queue. With a spool directory, it loads the copies pending
// in its spool, or creates an empty spool. It starts no goroutines: copies
// fire only while [Queue.Run] or [Queue.Drain] runs.
func Open(opts Options) (*Queue, error) {
	if opts.Fire == nil {
		return nil, errors.New("retrytimer: Options.Fire is nil")
	}
	q := &Queue{
		fire:       opts.Fire,
		durable:    opts.Durable,
		stuck:      opts.Stuck,
		log:        opts.Logger,
		backoff:    opts.RetryBackoff,
		maxBackoff: opts.MaxRetryBackoff,
		compactMin: opts.CompactMinBytes,
		now:        opts.Now,
		maxMemory:  opts.MaxMemory,
		wake:       make(chan struct{}, 1),
		nextID:     1,
		origins:    newOriginTable(opts.Mark),
	}
	if q.log == nil {
		q.log = slog.New(slog.DiscardHandler)
	}
	q.log = q.log.With("component", "retrytimer")
	if q.now == nil {
		q.now = time.Now
	}
	q.latest = q.now().UnixNano()
	if q.backoff <= 0 {
		q.backoff = DefaultRetryBackoff
	}
	if q.maxBackoff <= 0 {
		q.maxBackoff = DefaultMaxRetryBackoff
	}
	q.maxBackoff = max(q.maxBackoff, q.backoff)
	if q.compactMin <= 0 {
		q.compactMin = DefaultCompactMinBytes
	}
	q.compactFloor = q.compactMin
	if opts.Dir == "" {
		return q, nil
	}
	sp, res, torn, err := openSpool(opts.Dir, q.origins)
	if err != nil {
		return nil, fmt.Errorf("retrytimer: %w", err)
	}
	if torn > 0 {
		q.log.Warn("truncated torn tail of spool", "path", sp.path, "offset", res.end, "bytes", torn)
	}
	q.sp, q.h, q.nextID = sp, res.entries, res.nextID
	// The clock of the previous process is not known: a copy scheduled
	// after now means the clock was stepped back since.
	if moved := q.rebase(q.latest); moved > 0 {
		q.log.Warn("wall clock is behind the time copies were scheduled; each is due its delay from now",
			"path", sp.path, "copies", moved)
	}
	heap.Init(&q.h)
	q.log.Info("spool loaded", "path", sp.path, "pending", len(q.h), "bytes", sp.size)
	return q, nil
}

// Schedule adds c, to be fired at due or as soon after as the queue runs. It
// keeps no reference to c's memory. With a spool, Schedule returns only once
// the copy is durable: concurrent calls share an fsync. A copy that
// Schedule failed to add may still fire.
//
// The copy's delay, due minus the clock's reading now (zero if due has
// passed), is kept with it: should the clock be stepped back, the copy is
// held at most that long after the queue notices (see the package
// documentation).
func (q *Queue) Schedule(c Copy, due time.Time) error {
	if due.Before(minDue) || due.After(maxDue) {
		return fmt.Errorf("retrytimer: due time %s out of range", due)
	}
	origin := q.origins.of(&c)
	pushed := false
	defer func() {
		if !pushed {
			q.origins.release(origin) // the copy was not scheduled
		}
	}()
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if q.err != nil {
		q.mu.Unlock()
		return q.err
	}
	// The clock is read under mu, so that readings reach observe in order.
	now := q.now()
	moved := q.observe(now.UnixNano())
	e := entry{due: due.UnixNano(), delay: int64(max(due.Sub(now), 0)), id: q.nextID, line: c.Line, origin: origin}
	if satSub(e.due, e.delay) > now.UnixNano()+int64(scheduleSlack) {
		// The wall clock stepped back between the caller's reading and
		// this one (the delay is measured on the monotonic clock): the
		// copy is due its delay from now, as rebase makes the others.
		e.due = satAdd(now.UnixNano(), e.delay)
	}
	rec, err := encodeSchedule(e.id, e.due, e.delay, &c)
	if err != nil {
		q.mu.Unlock()
		return fmt.Errorf("retrytimer: %w", err)
	}
	var n uint64
	if q.sp == nil {
		e.rec = rec
		q.memBytes += int64(len(rec))
	} else {
		if e.off, err = q.sp.append(rec); err != nil {
			if _, partial := errors.AsType[*partialWriteError](err); partial {
				q.fail(err)
				q.mu.Unlock()
				return q.err
			}
			q.mu.Unlock()
			return fmt.Errorf("retrytimer: spool: %w (nothing was written; try again)", err)
		}
		e.size = uint32(len(rec) - hdrSize)
		q.sp.live += e.recordSize()
		n = q.sp.written
		q.scheduled = n
	}
	q.nextID++
	heap.Push(&q.h, e)
	pushed = true
	first := q.h[0].id == e.id
	q.mu.Unlock()
	if first || moved > 0 {
		q.poke()
	}
	if q.sp == nil {
		return nil
	}
	return q.syncTo(n)
}

// WaitRoom waits until a memory-only queue holds fewer than
// [Options.MaxMemory] bytes of pending copies, so that a caller can hold
// back its input while delayed copies use up the memory allotted to them.
// It returns at once without a bound or with a spool (whose copies are on
// disk), [ErrClosed] once the queue is closed, the queue's failure if it
// failed, and ctx's error if ctx ends first.
func (q *Queue) WaitRoom(ctx context.Context) error {
	for {
		q.mu.Lock()
		switch {
		case q.closed:
			q.mu.Unlock()
			return ErrClosed
		case q.err != nil:
			err := q.err
			q.mu.Unlock()
			return err
		case !q.fullLocked():
			q.mu.Unlock()
			return nil
		}
		freed := q.freed.C()
		q.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Full reports whether [Queue.WaitRoom] would wait now: a memory-only
// queue holds [Options.MaxMemory] bytes of pending copies or more.
func (q *Queue) Full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.fullLocked()
}

// fullLocked is Full, called with mu held.
func (q *Queue) fullLocked() bool {
	return q.maxMemory > 0 && q.sp == nil && q.memBytes >= q.maxMemory
}

// Pending returns the number of copies not yet fired, including one that is
// being fired and those fired but not yet known durable (Options.Durable).
func (q *Queue) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.h) + q.inflight + len(q.undone)
}

// Origins returns the copies pending in the queue, except one being
// fired, grouped by the subscription that made them, their stream and
// key, and [Options.Mark]; in that order. A daemon that starts, or
// removes a subscription, tells by them the copies no subscription of its
// configuration will handle. It reads no spool.
func (q *Queue) Origins() []Origin {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.origins.count(q.h)
}

// Run fires copies as they come due until ctx is done, and then returns nil
// at once, leaving what is pending in the queue (and in the spool, if any).
// It returns an error if the spool fails: the queue then accepts no more
// copies, and the process should restart from the spool. Run and Drain do
// not run concurrently.
func (q *Queue) Run(ctx context.Context) error {
	if err := q.start(); err != nil {
		return err
	}
	defer q.stop()
	return q.loop(ctx, false)
}

// Drain fires copies as they come due, like Run, until none is pending or
// ctx is done, and returns how many are still pending: in memory-only mode
// they are abandoned, with a spool they stay in it. Copies scheduled while
// Drain runs are waited for too.
func (q *Queue) Drain(ctx context.Context) (abandoned int, err error) {
	if err := q.start(); err != nil {
		return q.Pending(), err
	}
	defer q.stop()
	err = q.loop(ctx, true)
	return q.Pending(), err
}

// Close syncs and closes the spool: copies fired so far are then not fired
// again after a restart. Pending copies stay in the spool. Close must not be
// called while Run or Drain runs; after Close, Schedule, Run and Drain
// return [ErrClosed].
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.running {
		q.mu.Unlock()
		return errors.New("retrytimer: close while Run or Drain is running")
	}
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	q.freed.Wake() // the callers of WaitRoom
	q.mu.Unlock()
	if q.sp == nil {
		return nil
	}
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	var err error
	if q.err == nil {
		if err = q.sp.f.Sync(); err != nil {
			q.fail(err)
		} else {
			q.synced = q.sp.written
		}
	}
	if err = errors.Join(err, q.sp.f.Close()); err != nil {
		return fmt.Errorf("retrytimer: close spool: %w", err)
	}
	return nil
}

func (q *Queue) start() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return ErrClosed
	case q.running:
		return errors.New("retrytimer: Run or Drain is already running")
	}
	q.running = true
	return nil
}

func (q *Queue) stop() {
	q.mu.Lock()
	q.running = false
	q.mu.Unlock()
}

// poke wakes the loop so that it looks at the queue again.
func (q *Queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// fail records the first spool failure and wakes the loop to report it. It
// is called with mu held.
func (q *Queue) fail(err error) {
	if q.err == nil {
		q.err = fmt.Errorf("retrytimer: spool: %w", err)
		q.poke()
	}
}

// failure returns the spool failure, if any.
func (q *Queue) failure() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// syncTo returns once the first n spool records are durable. One fsync
// covers every record written before it starts, so concurrent callers share
// it.
func (q *Queue) syncTo(n uint64) error {
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	if q.synced >= n {
		return nil
	}
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return q.err
	}
	target, f := q.sp.written, q.sp.f
	q.mu.Unlock()
	if err := f.Sync(); err != nil {
		q.mu.Lock()
		q.fail(err)
		q.mu.Unlock()
		return q.failure()
	}
	q.synced = target
	return nil
}

// loop fires due copies until ctx is done, the spool fails or, when drain
// is set, nothing is pending.
func (q *Queue) loop(ctx context.Context, drain bool) (err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		q.recordDone()
		q.reclaimSpool() // a stop must not leave a removed spool behind
		if err == nil {
			err = q.failure() // also one met recording the last copies done
		}
	}()
	q.maybeCompact()
	var check <-chan time.Time
	if q.sp != nil {
		t := time.NewTicker(spoolCheckEvery)
		defer t.Stop()
		check = t.C
	}
	for ctx.Err() == nil {
		select { // also while due copies keep the loop from waiting
		case <-check:
			if q.recordDone() { // the copies fired are done: a rewrite keeps the rest
				q.reclaimSpool()
			}
		default:
		}
		var wait time.Duration
		if q.held && !q.recordDone() {
			wait = q.backoff // Durable still fails: nothing more fires until it passes
		} else {
			if wait, err = q.fireOne(ctx); err != nil {
				return err
			}
			if wait == 0 && len(q.undone) < doneBatch {
				continue
			}
			if !q.recordDone() {
				wait = q.backoff
			}
		}
		switch {
		case wait == 0:
			continue
		case wait < 0 && drain:
			return nil
		}
		var timeout <-chan time.Time
		if wait > 0 {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			timeout = timer.C
		}
		select {
		case <-ctx.Done():
		case <-q.wake:
		case <-timeout:
		case <-check:
			q.reclaimSpool()
		}
	}
	return nil
}

// fireOne fires the first copy if it is due and returns 0. Otherwise it
// returns how long until the first copy is due, or -1 if none is pending.
func (q *Queue) fireOne(ctx context.Context) (time.Duration, error) {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return 0, q.err
	}
	now := q.now().UnixNano()
	q.observe(now)
	if len(q.h) == 0 {
		q.mu.Unlock()
		return -1, nil
	}
	if wait := q.h[0].due - now; wait > 0 {
		q.mu.Unlock()
		return time.Duration(wait), nil
	}
	e := heap.Pop(&q.h).(entry)
	c, err := q.copyOf(&e)
	if err != nil {
		heap.Push(&q.h, e)
		q.fail(err)
		q.mu.Unlock()
		return 0, q.err
	}
	c.Line = e.line
	q.inflight++
	q.mu.Unlock()

	ferr := q.fire(ctx, c)

	q.mu.Lock()
	q.inflight--
	switch {
	case ferr == nil && q.sp != nil:
		q.sp.live -= e.recordSize()
		q.undone = append(q.undone, e.id) // recordDone writes its done record
		q.origins.release(e.origin)
	case ferr == nil:
		q.memBytes -= int64(len(e.rec))
		q.freed.Wake() // the callers of WaitRoom
		q.origins.release(e.origin)
	case ctx.Err() != nil:
		// Stopping: the copy stays pending as it was.
		heap.Push(&q.h, e)
	default:
		e.tries++
		retry := q.retryDelay(e.tries)
		now := q.now().UnixNano()
		q.observe(now)
		e.due, e.delay = satAdd(now, int64(retry)), int64(retry)
		heap.Push(&q.h, e)
		q.mu.Unlock()
		q.logFireError(c, e.tries, retry, ferr)
		return 0, nil
	}
	err = q.err
	q.mu.Unlock()
	return 0, err
}

// recordDone makes the copies fired since its last call durable
// (Options.Durable), records them as done in the spool, and then compacts
// the spool if it is due. It reports false if Durable failed, or a done
// record could not be written for a full disk (Options.Stuck): the copies
// stay pending in the spool, and the next call tries again. A spool that
// fails here (another write error, or one it could not undo) is reported
// by the loop.
func (q *Queue) recordDone() bool {
	q.held = false
	if len(q.undone) == 0 {
		return true
	}
	if q.durable != nil {
		if err := q.durable(); err != nil {
			q.held = true
			if ok, suppressed := q.durableLog.Allow(time.Now()); ok {
				q.log.Warn("fired copies cannot be made durable; they stay pending in the spool and are synced again",
					"copies", len(q.undone), "suppressed", suppressed, "err", err)
			}
			return false
		}
	}
	// A copy fires as soon as it is queued, maybe before the fsync of its
	// schedule record ends: its done record goes to disk only after it,
	// or a crash could keep the done record and tear the other, which
	// reads as a damaged spool rather than a torn tail.
	q.mu.Lock()
	scheduled := q.scheduled
	q.mu.Unlock()
	q.syncTo(scheduled) // a failure is q.err: the loop below writes nothing then
	q.mu.Lock()
	for i, id := range q.undone {
		if q.err != nil {
			break // nothing is written after a failure: the copy fires again after the restart
		}
		_, err := q.sp.append(encodeDone(id))
		if _, partial := errors.AsType[*partialWriteError](err); !partial && durable.NoSpace(err) {
			// Not written, and the spool as it was: the rest stay to be
			// recorded, and nothing fires until they are, so that a
			// restart meanwhile fires again only these.
			q.undone = append(q.undone[:0], q.undone[i:]...)
			q.held = true
			q.mu.Unlock()
			q.doneTrouble.Failed(q.log, "the retry spool cannot record the copies fired as done, its disk full; no copy fires until it can, "+
				"and a restart before then fires these again", err, "path", q.sp.path, "copies", len(q.undone))
			if q.stuck != nil {
				q.stuck(err)
			}
			return false
		} else if err != nil {
			q.fail(err)
		}
	}
	q.undone = q.undone[:0]
	failed := q.err != nil
	q.mu.Unlock()
	if !failed && q.doneTrouble.Failing() {
		q.doneTrouble.Passed(q.log, "the retry spool records the copies fired as done again")
		if q.stuck != nil {
			q.stuck(nil)
		}
	}
	q.maybeCompact()
	return true
}

// observe takes a reading of the clock, Unix ns. A reading earlier than the
// latest one means the wall clock was stepped back: every entry that now
// looks scheduled in the future is made due its delay after now, so that no
// copy waits much longer than its delay however far the clock went back. It
// returns how many entries moved. It is called with mu held; a scan of the
// heap happens only when the clock went back.
func (q *Queue) observe(now int64) int {
	back := now < q.latest
	q.latest = now
	if !back {
		return 0
	}
	moved := q.rebase(now)
	if moved > 0 {
		heap.Init(&q.h)
		q.log.Warn("wall clock stepped back; pending copies are due their delay from now", "copies", moved)
	}
	return moved
}

// rebase makes every entry scheduled after now (due minus delay) due its
// delay after now, without restoring the heap order, and returns how many
// it moved. Entries of type 1 records, whose delay is not known, keep
// their due time. It is called with mu held, or before the queue is shared.
func (q *Queue) rebase(now int64) int {
	moved := 0
	for i := range q.h {
		e := &q.h[i]
		if e.delay >= 0 && satSub(e.due, e.delay) > now {
			e.due = satAdd(now, e.delay)
			moved++
		}
	}
	return moved
}

// satAdd returns a+b and satSub a-b, for b ≥ 0, saturated at the int64 range.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satSub(a, b int64) int64 {
	if a < math.MinInt64+b {
		return math.MinInt64
	}
	return a - b
}

// copyOf returns the copy e schedules. It is called with mu held.
func (q *Queue) copyOf(e *entry) (Copy, error) {
	var b body
	var err error
	if q.sp == nil {
		b, err = decodeBody(slices.Clone(e.rec[hdrSize:]))
	} else {
		var buf []byte
		_, b, err = q.sp.read(e, &buf)
	}
	if err != nil {
		return Copy{}, err
	}
	return b.copy(), nil
}

// retryDelay returns the backoff after the given number of failed tries.
func (q *Queue) retryDelay(tries uint32) time.Duration {
	d := q.backoff
	for i := uint32(1); i < tries; i++ {
		if d >= q.maxBackoff/2 {
			return q.maxBackoff
		}
		d *= 2
	}
	return min(d, q.maxBackoff)
}

func (q *Queue) logFireError(c Copy, tries uint32, retry time.Duration, err error) {
	ok, suppressed := q.fireLog.Allow(time.Now())
	if !ok {
		return
	}
	q.log.Warn("fire failed, will retry", "stream", c.Stream, "key", c.Key, "attempt", tries,
		"retry_in", retry, "suppressed", suppressed, "err", err)
}

// spoolCheckEvery is how often the loop checks that the spool's path still
// names the file it writes (reclaimSpool).
const spoolCheckEvery = 5 * time.Second

// reclaimSpool writes the spool again at its path, with the copies
// pending, when it was removed while the daemon runs (a state directory
// cleaned by hand), which would leave the next start without them. A file
// at the path that is not the spool is another streamd's, which took the
// directory (its lock says so to the commits): it is left alone. It runs
// on the loop's goroutine, so no copy is being fired.
func (q *Queue) reclaimSpool() {
	if q.sp == nil {
		return
	}
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	// Copies fired but not yet recorded done keep their schedule records
	// until they are, which a rewrite would drop: the next check comes.
	if q.err != nil || len(q.undone) > 0 {
		return
	}
	if _, err := os.Lstat(q.sp.path); !errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err := q.compact(); err != nil {
		if q.err == nil { // else the loop reports it
			q.reclaimLog.Warn(q.log, msgSpoolRemoved+", and cannot be written again; it is tried again", "path", q.sp.path, "pending", len(q.h), "err", err)
		}
		return
	}
	q.log.Warn(msgSpoolRemoved+"; it is written again", "path", q.sp.path, "pending", len(q.h))
}

// spoolAtPath reports whether the spool's path names the file the queue
// writes, which a compaction replaces: not when it was removed, or another
// streamd's took the path.
func (q *Queue) spoolAtPath() bool {
	held, err := q.sp.f.Stat()
	if err != nil {
		return false
	}
	fi, err := os.Stat(q.sp.path)
	return err == nil && os.SameFile(fi, held)
}

// msgSpoolRemoved begins the log lines of reclaimSpool.
const msgSpoolRemoved = "the retry spool was removed while streamd ran, with the copies pending in it"

// maybeCompact compacts the spool when fired copies take more room than
// pending ones and at least compactFloor bytes. It runs on the loop's
// goroutine, so no copy is being fired.
func (q *Queue) maybeCompact() {
	if q.sp == nil {
		return
	}
	need := func() bool {
		dead := q.sp.dead()
		// Copies fired but not yet recorded done keep their schedule
		// records until they are: a compaction would drop them.
		return q.err == nil && !q.closed && len(q.undone) == 0 && dead >= q.compactFloor && dead > q.sp.live
	}
	q.mu.Lock()
	ok := need()
	q.mu.Unlock()
	if !ok {
		return
	}
	q.syncMu.Lock()
	defer q.syncMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if !need() || !q.spoolAtPath() {
		return
	}
	before := q.sp.size
	err := q.compact()
	switch {
	case q.err != nil:
		// The loop reports it.
	case err != nil:
		q.compactFloor = q.sp.dead() + q.compactMin
		q.log.Warn("spool compaction failed", "path", q.sp.path, "err", err)
	default:
		q.compactFloor = q.compactMin
		q.log.Debug("spool compacted", "path", q.sp.path, "bytes_before", before, "bytes_after", q.sp.size,
			"pending", len(q.h))
	}
}

// compact rewrites the spool with the schedule records of pending entries
// only. It is called with syncMu and mu held and nothing in flight. An error
// before the new file replaces the old one leaves the spool as it was; an
// error after that fails the queue.
func (q *Queue) compact() error {
	offs := make([]int64, len(q.h))
	var buf []byte
	f, size, renamed, err := replaceFile(q.sp.path, func(w io.Writer, off int64) (int64, error) {
		for i := range q.h {
			rec, _, err := q.sp.read(&q.h[i], &buf)
			if err != nil {
				return 0, err
			}
			if _, err := w.Write(rec); err != nil {
				return 0, err
			}
			offs[i] = off
			off += int64(len(rec))
		}
		return off, nil
	})
	switch {
	case !renamed:
		return err
	case err != nil:
		// The old file is gone, and the new one may not be durable.
		q.fail(err)
		return err
	}
	old := q.sp.f
	q.sp.f, q.sp.size = f, size
	for i := range q.h {
		q.h[i].off = offs[i]
	}
	q.synced = q.sp.written
	if err := old.Close(); err != nil {
		q.fail(err)
		return err
	}
	return nil
}
