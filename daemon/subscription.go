package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// trackerWindow bounds the records in flight per subscription: a slow
// handler slows its reader instead of growing memory (Invariant 5).
const trackerWindow = 4096

// subscription follows one stream file and hands the records of its key to
// its handler, settling each outcome and storing the position of the
// longest settled prefix (Invariant 1).
type subscription struct {
	*deliverer // its cfg is the subscription's configuration
	stream     *stream
	store      *offsets.Store
	// copyLog limits the log of copies that cannot be written.
	copyLog ratelog.Trouble
	// health is its health while it runs: its stream file, its copies.
	health *subHealth

	// batches is how records are gathered into batches, nil when the
	// subscription sends none.
	batches *batching

	ahead *readAhead // its follower, read ahead
	// tracker holds the records handed out of file. The reader replaces
	// both, under fileMu, once every record of the old ones has settled;
	// settled reads them under fileMu's read lock, so that a worker still
	// storing the old file's last position does not mix the two.
	fileMu  sync.RWMutex
	tracker *offsets.Tracker
	file    streamfile.Identity
	// behind is the file read before file and its tracker while records
	// of it handed out have not all settled: the position stays in it
	// until they have (settled drops it then), and the records of file
	// are handed out meanwhile. nil when none is. The reader sets it under
	// fileMu; settled drops it under fileMu's read lock.
	behind atomic.Pointer[fileTracker]
	setMu  sync.Mutex // settled's read of the committable position and its store

	// scratch holds, per worker, the memory its deliveries are made in;
	// with batches, the reader's is the first.
	scratch []scratch

	idHash string // fileID's, of s.file; "" until computed

	// settledBefore is the records of the file settledIn after the start
	// position that the run before, stopped by a reload or a stop, had
	// settled (takeOver): they are not delivered again. Used by the reader
	// alone.
	settledBefore []offsets.Span
	settledIn     streamfile.Identity

	// held is the file of the position once the run ended, open, and the
	// files read after it, for a subscription started in its place
	// (heldFiles); heldTaken, once heldFiles was called. Under fileMu.
	held      heldFiles
	heldTaken bool
}

// fileTracker is a file and the tracker of the records handed out of it.
type fileTracker struct {
	file    streamfile.Identity
	tracker *offsets.Tracker
}

// position returns the file the position is in and its tracker: the file
// behind, while records of it are unsettled, else the file read. The
// caller holds fileMu.
func (s *subscription) position() (streamfile.Identity, *offsets.Tracker) {
	if b := s.behind.Load(); b != nil && !b.tracker.Settled() {
		return b.file, b.tracker
	}
	return s.file, s.tracker
}

// keepHeld keeps the file of s's position, and those read after it, open
// once its run ended, and closes the other files it held (readAhead.keep).
func (s *subscription) keepHeld() {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	file, _ := s.position()
	h := s.ahead.keep(file)
	if s.heldTaken {
		h.Close() // a stop that abandoned the run took none
		return
	}
	s.held = h
}

// heldFiles returns the file of s's position, open, and the files read
// after it, once its run ended: a reload hands them to the subscription it
// starts in s's place (tail.Options.Held and HeldAfter), so that they are
// read on from the position even when a rotation removed them from their
// directory meanwhile. The caller owns them. They are none when s holds
// none, or its run has not ended.
func (s *subscription) heldFiles() heldFiles {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	h := s.held
	s.held, s.heldTaken = heldFiles{}, true
	return h
}

// handOver returns what s settled beyond its committable position, once
// its run returned: records behind one still unsettled (held, or in
// flight), which a start at that position would deliver again. A reload
// hands it to the subscription it starts in s's place; a stop keeps it
// for the next start (offsets.Store.SaveSettled). Records of other keys
// (untagged) are left out, as a start passes them over again anyway; the
// records s was handed (takeOver) and has not read yet are kept.
func (s *subscription) handOver() offsets.Settled {
	s.fileMu.RLock()
	defer s.fileMu.RUnlock()
	file, t := s.position()
	records := slices.DeleteFunc(t.SettledAhead(), func(r offsets.Span) bool { return r.Tag == 0 })
	if s.settledIn == file {
		end := t.End()
		for _, r := range s.settledBefore {
			if r.Start >= end {
				records = append(records, r)
			}
		}
	}
	return offsets.Settled{Stream: s.stream.cfg.Path, File: file, Offset: t.Committable().Offset,
		Key: s.cfg.Key, RenamedFrom: s.cfg.RenamedFrom, Records: records}
}

// takeOver makes s, about to read from the stored position resume,
// committed at committedAt, skip the records its predecessor settled (h),
// when they are the same records for it: the same file and position (the
// same commit of it, for what a stop kept), and a configuration that wants
// the same records (key, and former names for its copies). It returns how
// many it skips.
func (s *subscription) takeOver(h offsets.Settled, resume *tail.Position, committedAt time.Time) int {
	same := resume != nil && h.Stream == s.stream.cfg.Path && h.File == resume.File && h.Offset == resume.Offset &&
		(h.CommittedAt.IsZero() || h.CommittedAt.Equal(committedAt)) &&
		h.Key == s.cfg.Key && slices.Equal(h.RenamedFrom, s.cfg.RenamedFrom)
	if !same {
		return 0
	}
	s.settledBefore, s.settledIn = h.Records, h.File
	return len(h.Records)
}

// settledAlready reports whether rec is one of the records the run before
// settled (takeOver).
func (s *subscription) settledAlready(rec *tail.Record) bool {
	if len(s.settledBefore) == 0 {
		return false
	}
	if rec.File != s.settledIn { // another file: those records are behind
		s.settledBefore = nil
		return false
	}
	for len(s.settledBefore) > 0 && s.settledBefore[0].End <= rec.Offset {
		s.settledBefore = s.settledBefore[1:]
	}
	return len(s.settledBefore) > 0 && s.settledBefore[0] == offsets.Span{Start: rec.Offset, End: rec.End, Seq: rec.Seq, Tag: recordTag(rec)}
}

// recordTag tells rec from another record written at the same offsets of
// a file with the same identity (written again in place under the same
// header): its timestamp and its checksum.
func recordTag(rec *tail.Record) uint64 {
	return rec.TimestampMs<<16 | uint64(rec.Checksum)
}

// job is one record handed to a worker when concurrency is above 1, or to
// the gatherer of batches. It owns its delivery's memory: the memory the
// record was read into is used again once the next records are read. For
// a worker, the delivery's Payload is the record, which the worker opens
// (deliver); for the gatherer, the delivery is opened, with headers and
// payload of its own.
type job struct {
	d        handler.Delivery
	ticket   offsets.Ticket
	prefixed bool // whether d's record starts with an envelope prefix
}

// scratch is the memory a worker makes its deliveries in, reused from one
// record to the next, so that a delivery allocates nothing: the headers and
// payload a handler gets are valid until the worker's next record, which it
// takes once the delivery is settled (see handler.Delivery). Once the
// delivery is over it keeps none of the record (release), and at most
// scratchKeep bytes of each buffer decoded from it.
type scratch struct {
	env     envelope.Parser
	headers envelope.Headers
	seq     [20]byte // the stream-sequence value
	// record is the record of the delivery in hand, as read. A blind
	// handler's delivery is made without it; deliver opens it when the
	// answer makes a copy.
	record []byte
}

// scratchKeep bounds what a worker's scratch keeps, between two records,
// of each buffer it decoded the last one's envelope into; a larger record
// has its own, let go once its delivery is over.
const scratchKeep = 64 << 10

// release lets go of the record the scratch opened, once the delivery
// made of it is over (settled, or left unsettled by a stop), or copied
// into a batch. The record is a copy made for a worker, or the
// read-ahead's memory, which the read-ahead lets go of after a record
// larger than its batches: kept until the worker's next record, it would
// keep the largest record in flight alive for each worker, for as long as
// the subscription stays quiet. What the parser decoded of it is kept up
// to scratchKeep bytes a buffer, for the next record.
func (sc *scratch) release() {
	sc.record = nil
	sc.env.Release(scratchKeep)
	sc.headers = envelope.ReleaseHeaders(sc.headers, scratchKeep) // their values are slices of the parser's memory
}

// run reads until ctx ends, the replay finishes, or the subscription fails.
// Handlers run with hctx, which the daemon ends at the shutdown deadline, so
// that deliveries in flight when reading stops can finish. A nil error means
// it stopped as asked or finished its replay.
func (s *subscription) run(ctx, hctx context.Context) error {
	s.ahead.start(ctx)
	defer s.ahead.Close()
	defer s.keepHeld()
	defer s.settler.unsupported.stop()
	workers := max(s.cfg.Concurrency, 1)
	jobs := make(chan job)
	var wg sync.WaitGroup
	// A worker that fails (a handler panic) stops the subscription at
	// once: the reading, also while it waits for a quiet file to grow, and
	// the other workers' deliveries held in place, whose records stay
	// unsettled as at any stop.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, workers)
	fail := func(err error) {
		errc <- err
		stop()
	}
	switch {
	case s.batches != nil:
		jobs = make(chan job, s.batches.maxRecords)
		s.runBatches(ctx, hctx, &wg, jobs, fail, workers)
	case workers > 1:
		startWorkers(&wg, workers, jobs, fail, func(j job, w int) error {
			return s.deliver(ctx, hctx, &j.d, j.ticket, w, j.prefixed)
		})
	}
	err := s.read(ctx, hctx, jobs)
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

// read is the reader loop: records in file order, each begun in the tracker
// before it is handed out. It returns nil when ctx ends.
func (s *subscription) read(ctx, hctx context.Context, jobs chan<- job) error {
	var delivery handler.Delivery
	start := s.tracker.Committable()
	lastSeq := start.Seq   // of the last record of the key handed out
	readTo := start.Offset // the end of the last record begun
	for {
		rec, err := s.ahead.Next(ctx)
		switch {
		case errors.Is(err, io.EOF):
			return nil // the replay finished, or the stream ended
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return err // the log and /healthz name the subscription
		}
		if rec.File != s.file || rec.Offset < readTo {
			if err := s.moveOn(ctx, rec); err != nil {
				return nil
			}
		}
		if rec.IsEOS() {
			// The position stays at the end-of-stream frame: a writer that
			// continues the file overwrites it (spec §10).
			continue
		}
		if !s.wanted(rec) {
			// Passed over: settled at once, with the sequence of the last
			// record of the key, which the stored position names.
			ticket, err := s.tracker.Begin(ctx, rec.Offset, rec.End, lastSeq)
			if err != nil {
				return stopped(ctx, err)
			}
			readTo = rec.End
			s.settled(ticket)
			continue
		}
		ticket, err := s.tracker.BeginTagged(ctx, rec.Offset, rec.End, rec.Seq, recordTag(rec))
		if err != nil {
			return stopped(ctx, err)
		}
		lastSeq, readTo = rec.Seq, rec.End
		if s.settledAlready(rec) {
			s.settled(ticket)
			continue
		}
		s.metrics.LastRecordTimestamp.Set(float64(rec.TimestampMs) / 1000)
		d := &delivery
		*d = handler.Delivery{
			Subscription: s.cfg.Name, Key: rec.Key, Shard: rec.Shard, Seq: rec.Seq, TimestampMs: rec.TimestampMs,
			Payload: rec.Payload, File: s.fileID(), Offset: rec.Offset, Checksum: rec.Checksum,
		}
		if s.inline() {
			// Delivered and settled before the next read: the record
			// can stay where it was read.
			if err := s.deliver(ctx, hctx, d, ticket, 0, s.ahead.Prefixed()); err != nil {
				return err
			}
			continue
		}
		if s.batches == nil {
			d.Payload = bytes.Clone(rec.Payload) // for the worker to open
		} else {
			// A batch holds its deliveries together: each is opened
			// here, into memory of its own.
			opened := s.open(d, 0, false, s.ahead.Prefixed())
			if opened {
				d.Headers, d.Payload = d.Headers.Clone(), bytes.Clone(d.Payload)
			}
			s.scratch[0].release()
			if !opened {
				s.passOver(ticket)
				continue
			}
		}
		select {
		case jobs <- job{*d, ticket, s.ahead.Prefixed()}:
			d.Headers, d.Payload = nil, nil // the job's now: not to keep them alive here
		case <-ctx.Done():
			return nil
		}
	}
}

// stopped returns nil for an error that ctx's end caused, the end of the
// subscription, and err for any other.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// startWorkers starts n workers in wg, numbered from 0, that each do the
// values they take from in until it closes; a worker whose do fails gives
// its error to fail and stops.
func startWorkers[T any](wg *sync.WaitGroup, n int, in <-chan T, fail func(error), do func(v T, w int) error) {
	for w := range n {
		wg.Go(func() {
			for v := range in {
				if err := do(v, w); err != nil {
					fail(err)
					return
				}
			}
		})
	}
}

// inline reports whether the reader delivers each record itself before it
// reads the next: concurrency 1, without batches.
func (s *subscription) inline() bool {
	return s.cfg.Concurrency <= 1 && s.batches == nil
}

// moveOn makes rec, of another file or of this one read again from an
// earlier offset (truncated in place, and written again under the same
// header), the first record of a new tracker: offsets start over. Records
// of the file left that are still unsettled stay behind it (s.behind), its
// position stored until they settle, while the new file's are handed out:
// a record in hand, or held while its handler fails, does not hold back
// the file a rotation put at the path. One file at most stays behind:
// moving on again, and reading the same file again, first waits for every
// record of the files it leaves to settle. It returns ctx's error if ctx
// ends first.
func (s *subscription) moveOn(ctx context.Context, rec *tail.Record) error {
	if b := s.behind.Load(); b != nil {
		if err := b.tracker.Wait(ctx); err != nil {
			return err
		}
	}
	if rec.File == s.file {
		if err := s.tracker.Wait(ctx); err != nil {
			return err
		}
	}
	s.fileMu.Lock()
	var left *fileTracker
	if !s.tracker.Settled() {
		left = &fileTracker{file: s.file, tracker: s.tracker}
	}
	s.behind.Store(left)
	s.file, s.tracker = rec.File, s.tracker.Continued(offsets.Mark{Offset: rec.Offset}, s.window())
	s.fileMu.Unlock()
	s.ahead.release(func(id streamfile.Identity) bool { return id == rec.File || left != nil && id == left.file })
	s.idHash, s.settledBefore = "", nil
	return nil
}

// fileID returns the identity of s.file as deliveries carry it
// ([handler.Delivery.File]): a hash of the inode and the header's creation
// time and file name, computed once per file. With the record's offset it
// identifies the record for good: the same when it is read again after a
// restart or a reboot (the device number, which a reboot may change, is
// left out), another for a copy written elsewhere.
func (s *subscription) fileID() string {
	if s.idHash == "" {
		sum := sha256.New()
		fmt.Fprintf(sum, "%d\x00%d\x00%s", s.file.Ino, s.file.CreatedAtMs, s.file.FileName)
		s.idHash = hex.EncodeToString(sum.Sum(nil)[:12])
	}
	return s.idHash
}

// foreign reports whether a record whose origin header is origin (when it
// carries one) is a retry copy made by another subscription, of this
// daemon or of another one reading the same file: a copy that carries an
// origin is for that origin only, which handles it again; every other
// subscription passes over it. Subscription names must therefore be unique
// among the daemons that read one file. The copies made under a name the
// subscription had before (renamed_from) are its own.
func (s *subscription) foreign(origin []byte, carried bool) bool {
	if !carried || string(origin) == s.cfg.Name {
		return false
	}
	for _, name := range s.cfg.RenamedFrom {
		if string(origin) == name {
			return false
		}
	}
	return true
}

// wanted reports whether rec is for this subscription's handler.
func (s *subscription) wanted(rec *tail.Record) bool {
	return rec.Key == s.cfg.Key && rec.Key != reservedKey
}

// open makes d, whose Payload is the record as read, the delivery of the
// record in scratch w, and reports false for a foreign copy, which is not
// delivered. For a handler that reads records, it decodes the record's
// envelope, checked as envelope.Decode checks it (fill). A blind one gets
// the metadata alone: the envelope's text is checked only when its headers
// name another origin, the one case where the record's fate depends on
// whether it is an envelope; a record without an envelope prefix
// (prefixed, as the reader found it) is not looked at: on a replay into
// discard, the payload is read by the reader's core alone.
func (s *subscription) open(d *handler.Delivery, w int, blind, prefixed bool) bool {
	sc := &s.scratch[w]
	sc.record = d.Payload
	if blind {
		if prefixed && s.foreign(sc.env.PeekHeader(sc.record, OriginHeader)) && sc.env.Check() {
			return false
		}
		d.Headers, d.Payload, d.Attempt = nil, nil, 0
		return true
	}
	h, enveloped := sc.env.Parse(sc.record)
	if s.foreign(h.Get(OriginHeader)) {
		return false
	}
	s.fill(d, sc, h, enveloped)
	return true
}

// passOver settles a foreign copy, which is not delivered.
func (s *subscription) passOver(ticket offsets.Ticket) {
	s.metrics.HandlerRecords[metrics.OutcomeForeignCopy].Inc()
	s.settled(ticket)
}

// fill sets the record of d from the record in sc, which sc.env parsed
// into h (enveloped says whether it is an envelope): the headers (none for
// a plain record) with stream-sequence set to the record's sequence, in
// sc's memory; the payload; the attempt.
func (s *subscription) fill(d *handler.Delivery, sc *scratch, h envelope.Headers, enveloped bool) {
	sc.headers = append(sc.headers[:0], h...)
	sc.headers.Set(envelope.SequenceHeader, strconv.AppendUint(sc.seq[:0], d.Seq, 10))
	d.Headers, d.Payload = sc.headers, sc.record
	if enveloped {
		d.Payload = sc.env.Payload()
	}
	d.Attempt = envelope.RetryCount(d.Headers) + 1
}

// deliver hands d, with the record as its Payload (prefixed: whether it
// starts with an envelope prefix), to the handler on worker w until it
// answers (answer: a failed delivery is held in place),
// and settles the answer; a foreign copy is passed over, settled at once.
// A copy that cannot be written is tried again until it is (finish).
// When the subscription stops (ctx) while the delivery is held, or before
// a copy could be written, the record stays unsettled, and is read again
// after a restart. Handlers run with hctx.
func (s *subscription) deliver(ctx, hctx context.Context, d *handler.Delivery, ticket offsets.Ticket, w int, prefixed bool) error {
	defer func() {
		s.scratch[w].release()
		d.Headers, d.Payload = nil, nil // the delivery's: the record's, the scratch's
	}()
	if !s.open(d, w, s.blind, prefixed) {
		s.passOver(ticket)
		return nil
	}
	handed := monoNow()
	s.workers[w].handed.Store(handed)
	defer s.workers[w].handed.Store(0)
	o, err := s.answer(hctx, ctx.Done(), d, w, slog.Int64("offset", d.Offset), handed)
	switch {
	case errors.Is(err, errStopped):
		return nil
	case err != nil:
		return err
	}
	if s.blind && writesCopy(o) {
		sc := &s.scratch[w]
		h, enveloped := sc.env.Parse(sc.record)
		s.fill(d, sc, h, enveloped) // the copy is made of the record
	}
	if s.finish(hctx, d, o) {
		s.settled(ticket)
	}
	return nil
}

// copyRetryMax bounds the wait before a copy that could not be written is
// tried again. Its file, or the retry spool, is on a local disk: room made
// or a disk repaired should be used within seconds, not at the last of
// the backoff steps meant for a handler's endpoint (minutes).
const copyRetryMax = 5 * time.Second

// finish settles the answer o of d: its copy, if it makes one, is
// written, tried again with the backoff (at most copyRetryMax apart)
// until it is. It returns true when the record's outcome is final, and
// false when hctx ends first: the record stays unsettled.
func (s *subscription) finish(hctx context.Context, d *handler.Delivery, o handler.Outcome) bool {
	s.settler.count(o)
	for attempt := uint64(1); ; attempt++ {
		err := s.settler.carryOut(hctx, d, o)
		if err == nil {
			if attempt > 1 {
				s.copyLog.Passed(s.logger, "publishing copies works again", "seq", d.Seq)
				s.health.setCopies("")
			}
			return true
		}
		wait := min(s.settler.backoffFor(attempt), copyRetryMax)
		s.copyLog.Failed(s.logger, "publishing the copy failed; the record stays unsettled and is retried",
			err, "seq", d.Seq, "retry_in", wait)
		s.health.setCopies("its copies cannot be written: " + err.Error())
		select {
		case <-time.After(wait):
		case <-hctx.Done():
			return false
		}
	}
}

// settled marks records final and stores the committable position.
func (s *subscription) settled(tickets ...offsets.Ticket) {
	s.fileMu.RLock()
	defer s.fileMu.RUnlock()
	b := s.behind.Load()
	for _, ticket := range tickets {
		t := s.tracker
		if b != nil && !t.Owns(ticket) {
			t = b.tracker
		}
		if err := t.Settle(ticket); err != nil {
			s.logger.Error("settling a record", "err", err)
			return
		}
	}
	// One worker at a time reads the committable position and stores it,
	// so that a worker that read it before another's later settle cannot
	// store it after that one's.
	s.setMu.Lock()
	defer s.setMu.Unlock()
	file, t := s.position()
	if b != nil && file == s.file && s.behind.CompareAndSwap(b, nil) { // every record of it settled
		s.ahead.release(func(id streamfile.Identity) bool { return id != b.file })
	}
	m := t.Committable()
	if err := s.store.Set(s.cfg.Name, offsets.Position{Stream: s.stream.cfg.Path, File: file, Offset: m.Offset, LastSeq: m.Seq}); err != nil {
		s.logger.Error("storing the position", "err", err)
	}
	s.metrics.Position.Set(float64(m.Offset))
}

// tailObserver counts what a subscription's follower reads and what
// happens to its file, and makes the subscription unhealthy while the
// file cannot be read.
type tailObserver struct {
	sub    *metrics.SubscriptionMetrics
	stream *metrics.StreamMetrics
	health *subHealth
	// The stream's name and poll interval, for the health's reason.
	streamName string
	poll       time.Duration
}

func (o tailObserver) Read(records, bytes int64) {
	o.sub.RecordsRead.Add(float64(records))
	o.sub.ReadBytes.Add(float64(bytes))
}

// eventReasons is the read error reason each follower event that is a
// problem is counted under, and eventChanges the file change each routine
// one is (a rotation's: what it lost is told as EventLost). A poll read is
// neither.
var (
	eventReasons = map[tail.Event]metrics.Reason{
		tail.EventOverflow:   metrics.ReasonOverflow,
		tail.EventTornTail:   metrics.ReasonTornTail,
		tail.EventChecksum:   metrics.ReasonChecksum,
		tail.EventFormat:     metrics.ReasonFormat,
		tail.EventUnreadable: metrics.ReasonUnreadable,
		tail.EventLost:       metrics.ReasonLost,
	}
	eventChanges = map[tail.Event]metrics.Change{
		tail.EventReplaced:  metrics.ChangeReplaced,
		tail.EventRemoved:   metrics.ChangeRemoved,
		tail.EventTruncated: metrics.ChangeTruncated,
	}
)

func (o tailObserver) Event(e tail.Event) {
	switch e {
	case tail.EventOverflow:
		o.stream.WatchOverflows.Inc()
	case tail.EventPollRead:
		o.stream.PollReads.Inc()
	}
	if r, ok := eventReasons[e]; ok {
		o.sub.ReadErrors[r].Inc()
	}
	if c, ok := eventChanges[e]; ok {
		o.sub.FileChanges[c].Inc()
	}
}

// Trouble makes the subscription unhealthy while the file at its stream's
// path cannot be read (a file that is not a stream file, or cannot be
// opened or read, put there while it runs), with the reason a subscription
// waiting for its file at start has, and healthy again once it can.
func (o tailObserver) Trouble(err error) {
	if err == nil {
		o.health.setFile("")
		return
	}
	o.health.setFile(waitingReason(o.poll, fmt.Errorf("stream %q: %w", o.streamName, err)))
}
