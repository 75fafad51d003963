package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/pipe"
	"github.com/streamd/streamd/retrytimer"
)

// PipeOptions are what `streamd pipe` gives RunPipe.
type PipeOptions struct {
	Options
	In  io.Reader
	Out io.Writer
	// Progress, if set, follows how far the stage is through stdin, for a
	// caller that ends the process before RunPipe returns.
	Progress *StageProgress

	limits stageLimits // zero: stageMax; tests take smaller records
}

// RunPipe runs a pipeline stage: stdio lines from opts.In go to the
// subscriptions of their key; copies leave on opts.Out as stdio lines under
// out_retry (or dead_letter). Nothing is stored. At the end of the input,
// or when ctx ends, the stage waits up to shutdown_timeout for copies still
// delayed; it returns an error if it abandoned some, if stdout closed
// ([pipe.ErrClosed]), if a handler panicked, or at an invalid line under
// on_invalid = "fail" (the last two win over a closed stdout).
func RunPipe(ctx context.Context, cfg *conf.Config, opts PipeOptions) (err error) {
	st := newSetup(opts.Options)
	logger := st.logger
	// Reading stops when ctx ends or when stdout closes, even under a
	// delayed copy; handlers in flight get until shutdown_timeout.
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	context.AfterFunc(readCtx, func() { time.AfterFunc(time.Duration(cfg.ShutdownTimeout), cancelHandlers) })
	stopLogged := context.AfterFunc(ctx, func() { logger.Info("stopping", "shutdown_timeout", time.Duration(cfg.ShutdownTimeout)) })
	defer stopLogged()
	out := pipe.NewWriter(opts.Out)
	warnDevNull(opts.Out, logger)
	progress := cmp.Or(opts.Progress, new(StageProgress))
	// A closed stdout (the next stage ended) stops reading, and the drain
	// of the delayed copies at the end: no copy can leave any more.
	drainCtx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDrain()
	queue, err := retrytimer.Open(retrytimer.Options{
		Fire: func(_ context.Context, c retrytimer.Copy) error {
			err := out.Write(c.Key, c.Record)
			if out.Err() != nil { // closed, or failed: no copy can leave any more
				stopReading()
				stopDrain()
			}
			if err == nil {
				st.countFired(c.Subscription)
				progress.done(c.Line)
			}
			return err
		},
		Logger:    logger,
		MaxMemory: int64(cfg.MaxDelayedMiB) << 20,
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, queue.Close()) }()
	st.metrics.CountRetriesPending(queue.Pending)
	subs, err := st.pipeSubscriptions(ctx, cfg, pipeCopies{out: out, queue: queue, reading: readCtx, progress: progress,
		logger: logger, maxDelayedMiB: cfg.MaxDelayedMiB, full: new(ratelog.Line)})
	if err != nil {
		if ctx.Err() != nil {
			// Told to stop while a handler was still connecting: a stop
			// before any line was read, not a failure.
			logger.Info("told to stop while building the handlers; stopping before reading any line", "err", err)
			return nil
		}
		return err
	}
	st.metrics.ObserveReload(time.Now(), nil) // the configuration loaded, as a run's start says
	defer st.closePipeHandlers(subs)
	var server sync.WaitGroup
	defer server.Wait()
	sctx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServer()
	if err := st.serveMetrics(sctx, &server, cfg.Metrics); err != nil {
		return err
	}

	// The queue runs on drainCtx too: a copy that finds stdout closed or
	// failing stops it, and stays pending, counted among the lost, without
	// a "will retry" it would never get.
	qctx, stopQueue := context.WithCancel(drainCtx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := queue.Run(qctx); err != nil {
			logger.Error("retry queue failed", "err", err)
		}
	})
	wg.Go(func() { observeEach(qctx, subs) })
	readErr := readLines(readCtx, hctx, opts.In, cmp.Or(opts.limits, stageMax), subs, st.metrics, logger, progress)
	stopQueue()
	wg.Wait()

	// outputEnd ends a stage whose stdout takes no more lines, having lost
	// lost copies: closed by the next stage, with pipe.ErrClosed (exit
	// status 0); failed, with that failure (exit status 1). A failure of
	// another kind (a panic, an invalid line) wins.
	outputEnd := func(lost int) error {
		var other error
		if !errors.Is(readErr, errCopyLost) {
			other = readErr
		}
		if err := out.Err(); !errors.Is(err, pipe.ErrClosed) {
			logger.Error(msgStdoutFailed, "err", err, "lost_copies", lost, "resume_line", progress.Resume())
			return errors.Join(other, fmt.Errorf("%w (copies lost: %d; the last line written may be cut short)", err, lost))
		}
		logger.Warn(msgStdoutClosed, "lost_copies", lost, "resume_line", progress.Resume())
		return cmp.Or(other, pipe.ErrClosed)
	}
	if out.Err() != nil {
		// A delayed copy, or one written while reading, found stdout
		// closed or failing: the copies still delayed cannot leave.
		lost := queue.Pending()
		if errors.Is(readErr, errCopyLost) {
			lost++
		}
		return outputEnd(lost)
	}
	dctx, cancel := context.WithTimeout(drainCtx, time.Duration(cfg.ShutdownTimeout))
	defer cancel()
	abandoned, derr := queue.Drain(dctx)
	if out.Err() != nil {
		return outputEnd(abandoned)
	}
	if abandoned > 0 {
		resume := progress.Resume()
		logger.Warn("graceful shutdown timed out; abandoning in-flight continuations", "abandoned", abandoned, "resume_line", resume)
		derr = errors.Join(derr, fmt.Errorf("delayed copies abandoned after shutdown_timeout (%s): %d; to lose none, feed the input to a stage again from line %d", time.Duration(cfg.ShutdownTimeout), abandoned, resume))
	}
	if errors.Is(derr, pipe.ErrClosed) {
		derr = pipe.ErrClosed
	}
	return errors.Join(readErr, derr)
}

// msgStdoutClosed is logged when the next stage closed stdout, which ends
// the stage with exit status 0. A stage finds out only when a copy's write
// fails, so copies are lost: that one, and those still delayed.
const msgStdoutClosed = "stdout was closed by the next stage; stopping: the copies not yet written are lost"

// msgStdoutFailed is logged when a write of stdout failed otherwise than
// at a closed pipe (a full disk), which ends the stage with exit status 1:
// no line can follow the one the write may have left cut short.
const msgStdoutFailed = "writing stdout failed; stopping: the copies not yet written are lost, and the last line written may be cut short, which the next stage reads as a record"

// errCopyLost is readLines' error when a copy's write found stdout closed
// or failing: that copy is lost.
var errCopyLost = errors.New("a copy could not be written")

// observeEach sets the in-flight gauges of the deliverers every second
// until ctx ends.
func observeEach(ctx context.Context, dls []*deliverer) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, dl := range dls {
				dl.observe()
			}
		}
	}
}

// pipeSubscriptions builds the deliverers of a pipe stage's subscriptions;
// ctx's end (a stop) ends the build of their handlers.
func (st *setup) pipeSubscriptions(ctx context.Context, cfg *conf.Config, copies pipeCopies) ([]*deliverer, error) {
	hs, err := st.newHandlers(ctx, cfg, cfg.Subscriptions)
	if err != nil {
		return nil, err
	}
	var subs []*deliverer
	for i, sc := range cfg.Subscriptions {
		sm := st.metrics.Subscription(sc.Name, "stdin")
		sm.SetHealthy(true, "")
		copies.subscription = sc.Name
		subs = append(subs, newDeliverer(sc, hs[i], stdioTransport, copies, sm, st.logger.With("subscription", sc.Name)))
	}
	return subs, nil
}

// closePipeHandlers closes the handlers the stage built.
func (st *setup) closePipeHandlers(subs []*deliverer) {
	for _, s := range subs {
		st.closeHandler(s.cfg.Name, s.handler)
		s.settler.unsupported.stop()
	}
}

// msgUnsubscribedLine is logged at the first stdin line of a key no
// subscription reads.
const msgUnsubscribedLine = "stdin line of a key no subscription reads dropped; the others are counted in streamd_pipe_unsubscribed_lines_total, and in all when the stage ends"

// msgUnterminatedLine is logged when the last line of stdin has no '\n'.
// It is handled as written (stdio format), but a stage before that exited
// in the middle of a write (at a second signal, or a stop not done in time)
// leaves such a line cut short.
const msgUnterminatedLine = "the last line of stdin has no newline: it is handled as it is, though a stage before this one that exited while writing it left it cut short"

// msgUnsubscribedTotal is logged when a stage ends that dropped more than
// one line of a key no subscription reads: how many, which the metric
// alone says (a stage without a metrics listener says it nowhere else).
const msgUnsubscribedTotal = "stdin lines of keys no subscription reads were dropped"

// stageLimits bound what a stage takes, so that the next stage reads every
// line it writes: records ([stageRecordSize]) of up to record bytes, in
// lines of up to line bytes, the longest line a copy of such a record
// takes (enveloped, its base64 a third longer than the record, with the
// headers the stage sets, under the longest producer header).
type stageLimits struct{ record, line int }

// stageCopyHeaders is the most that the headers a stage sets on a copy,
// stream-sequence and the retry count (decimal uint64s), add to a record's
// [envelope.Size]. A copy on stdout carries no origin (settler.copyRecord).
var stageCopyHeaders = envelope.Size(envelope.Headers{
	{Name: envelope.SequenceHeader, Value: []byte("18446744073709551615")},
	{Name: envelope.RetryCountHeader, Value: []byte("18446744073709551615")},
}, nil)

// limitsFor returns the limits of a stage that takes records of up to
// record bytes.
func limitsFor(record int) stageLimits {
	return stageLimits{record: record, line: pipe.MaxProducerHeaderLen + envelope.MaxLen(record+stageCopyHeaders)}
}

// stageMax is the limits of `streamd pipe`: records of up to 16 MiB, the
// lines `streamd publish` takes.
var stageMax = limitsFor(pipe.MaxLineBytes)

// stageRecordSize is the size of the record of h and payload that
// stageLimits bound: its [envelope.Size] without the headers the stage
// sets on its copies, whose values a record does not choose.
func stageRecordSize(h envelope.Headers, payload []byte) int {
	n := envelope.Size(h, payload)
	for _, name := range [...]string{envelope.SequenceHeader, envelope.RetryCountHeader} {
		if v, ok := h.Get(name); ok {
			n -= envelope.Size(envelope.Headers{{Name: name, Value: v}}, nil)
		}
	}
	return n
}

// stdinLine is a line the stage read: its text, or for a line longer than
// the limit, which the reader passed over, its error.
type stdinLine struct {
	text         []byte
	tooLong      error
	unterminated bool // the last line, without '\n'
}

// readLines reads stdin to its end (or until ctx ends) and hands each line
// to the subscriptions of its key, one line at a time. A line of a key no
// subscription reads is counted in m and dropped; the first is logged. A
// line that cannot be parsed, or that is longer or whose record is larger
// than lim allows, is invalid: counted in every
// subscription's read errors, and logged and skipped, or under
// on_invalid = "fail" the error that stops the stage. progress follows the
// lines dealt with.
func readLines(ctx, hctx context.Context, in io.Reader, lim stageLimits, subs []*deliverer, m *metrics.Metrics, logger *slog.Logger, progress *StageProgress) error {
	// stopped ends a stage that stops before the end of stdin, after
	// line last: says which lines it leaves.
	stopped := func(last int) error {
		progress.dealt(int64(last))
		logger.Warn(msgStoppedReading, progress.Attrs()...)
		return nil
	}
	// lost returns errCopyLost when stdout takes no more lines (closed, or
	// failed: the stage ends, and the copy of line lineNo is lost with the
	// lines after it), and otherwise logs the copy that could not be
	// published as lost.
	lost := func(s *deliverer, err error, lineNo int) error {
		if errors.Is(err, pipe.ErrClosed) || errors.Is(err, pipe.ErrFailed) {
			stopped(lineNo - 1)
			return fmt.Errorf("%w: %w", errCopyLost, err)
		}
		if err != nil {
			dest := s.settler.retryKey
			if ce, ok := errors.AsType[*errCopy](err); ok {
				dest = ce.dest // a dead letter's
			}
			logger.Warn("publishing the retry copy failed; message lost", "subscription", s.cfg.Name, "destination", dest, "err", err)
			progress.lose()
		}
		return nil
	}
	failOnInvalid := false
	for _, s := range subs {
		failOnInvalid = failOnInvalid || s.cfg.OnInvalid == "fail"
	}
	// Invalid lines are logged at most once every ratelog.Every, with the
	// count left out since the last: a file that is not stdio lines, fed
	// by mistake, is a line of log per line of input otherwise. Those
	// left out are logged once the limit allows when stdin goes quiet
	// (overdue), and at the end of the stage.
	var invalidLog ratelog.Limiter
	var lastInvalid struct {
		line int
		err  error
	}
	var overdue <-chan time.Time
	logLeftOut := func(n int) {
		if n > 0 {
			logger.Warn(msgInvalidLeftOut, "count", n, "last_line", lastInvalid.line, "last_err", lastInvalid.err)
		}
		overdue = nil
	}
	defer func() { logLeftOut(invalidLog.Drain()) }()
	invalid := func(lineNo int, err error) error {
		for _, s := range subs {
			s.metrics.ReadErrors[metrics.ReasonInvalidLine].Inc()
		}
		if failOnInvalid {
			stopped(lineNo - 1)
			return fmt.Errorf("stdin line %d: %w (on_invalid = \"fail\")", lineNo, err)
		}
		if ok, suppressed := invalidLog.Allow(time.Now()); ok {
			logger.Warn(msgInvalidLine, "line", lineNo, "err", err, "suppressed", suppressed)
			overdue = nil
		} else {
			lastInvalid.line, lastInvalid.err = lineNo, err
			if overdue == nil {
				overdue = time.After(invalidLog.Wait(time.Now()))
			}
		}
		return nil
	}
	// Reading stdin cannot be interrupted: a goroutine reads ahead, and
	// stops at the next line once this function returns.
	lines := make(chan stdinLine)
	readErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(lines)
		r := pipe.NewReaderLimit(in, lim.line)
		for {
			line, err := r.Take()
			var next stdinLine
			tooLong, isTooLong := errors.AsType[*pipe.LineTooLongError](err)
			switch {
			case isTooLong:
				next.tooLong = fmt.Errorf("longer than %d bytes, the longest line a stage reads", tooLong.Limit)
			case errors.Is(err, io.EOF):
				readErr <- nil
				return
			case err != nil:
				readErr <- err
				return
			default:
				next.text, next.unterminated = line, r.Unterminated()
			}
			select {
			case lines <- next:
			case <-stop:
				return
			}
		}
	}()
	subscribed := map[string]bool{}
	for _, s := range subs {
		subscribed[s.cfg.Key] = true
	}
	var unsubscribed struct {
		count, line int
		key         string
	}
	defer func() {
		if unsubscribed.count > 1 {
			logger.Warn(msgUnsubscribedTotal, "count", unsubscribed.count, "last_line", unsubscribed.line, "last_key", unsubscribed.key)
		}
	}()
	var seqs pipe.Sequencer
	var d handler.Delivery
	for lineNo := 1; ; lineNo++ {
		progress.dealt(int64(lineNo - 1))
		var next stdinLine
		var ok, taken bool
		for !taken {
			select {
			case next, ok = <-lines:
				taken = true
			case <-overdue:
				logLeftOut(invalidLog.Overdue(time.Now()))
			case <-ctx.Done():
				return stopped(lineNo - 1)
			}
		}
		if !ok {
			return <-readErr
		}
		if ctx.Err() != nil {
			return stopped(lineNo - 1) // a line taken at the same time is not handled
		}
		if next.tooLong != nil {
			if err := invalid(lineNo, next.tooLong); err != nil {
				return err
			}
			continue
		}
		line := next.text
		if next.unterminated {
			logger.Warn(msgUnterminatedLine, "line", lineNo)
		}
		l, err := pipe.ParseLine(line)
		if err != nil {
			if err := invalid(lineNo, err); err != nil {
				return err
			}
			continue
		}
		if l.HasStreamKey && !subscribed[string(l.StreamKey)] {
			// Its number is seen by no one, and its counter would be kept
			// for ever, so it takes none; but a line of key broadcast
			// numbers those without a key, which every subscription reads.
			key := string(l.StreamKey)
			if key == pipe.BroadcastKey && l.ShardID == 0 {
				seqs.Assign(&l)
			}
			m.CountUnsubscribedLine()
			if unsubscribed.count == 0 {
				logger.Warn(msgUnsubscribedLine, "line", lineNo, "key", key)
			}
			unsubscribed.count, unsubscribed.line, unsubscribed.key = unsubscribed.count+1, lineNo, key
			continue
		}
		payload := l.Payload // as the upstream reader keeps it (stdio-format §2.4)
		headers, body := envelope.Decode(payload)
		if n := stageRecordSize(headers, body); n > lim.record {
			// Invalid: it takes no sequence number, as a line that
			// cannot be parsed takes none.
			if err := invalid(lineNo, fmt.Errorf("its record is %d bytes of payload and headers, more than the %d a stage takes", n, lim.record)); err != nil {
				return err
			}
			continue
		}
		key, shard, seq := seqs.Assign(&l)
		ts := l.Timestamp
		if !l.HasTimestamp {
			ts = time.Now() // when it is read, the same for every subscription
		}
		fresh := true     // headers and body are no delivery's yet
		stopping := false // the stage stops: the rest of the line's subscriptions get copies
		for _, s := range subs {
			if l.HasStreamKey && s.cfg.Key != key {
				continue
			}
			s.metrics.RecordsRead.Inc()
			s.metrics.ReadBytes.Add(float64(len(line) + 1))
			if !fresh {
				headers, body = envelope.Decode(payload)
			}
			fresh = false
			headers.SetSequence(seq)
			// A record's timestamp counts from 1970: an earlier one (the
			// stdio format allows it) is 0, not a wrapped-around number.
			d = handler.Delivery{Subscription: s.cfg.Name, Key: key, Shard: shard, Seq: seq, TimestampMs: uint64(max(ts.UnixMilli(), 0)),
				Headers: headers, Payload: body, Attempt: envelope.RetryCount(headers) + 1}
			if !stopping {
				handed := monoNow()
				s.workers[0].handed.Store(handed)
				o, err := s.answer(hctx, ctx.Done(), &d, 0, slog.Int("line", lineNo), handed)
				s.workers[0].handed.Store(0)
				if err == nil {
					if err := lost(s, s.settler.settle(hctx, &d, o), lineNo); err != nil {
						return err
					}
					continue
				}
				if !errors.Is(err, errStopped) {
					stopped(lineNo - 1)
					return err // a panic
				}
				stopping = true
			}
			// A stage keeps no position: a record the handler did not
			// answer before the stage stops (or, for a line of every
			// subscription, was not given) leaves as a retry copy, not to
			// be lost; max_attempts does not judge it, since no attempt
			// was answered.
			s.logger.Info("the stage stops before the handler answered; the record leaves as a retry copy", "seq", d.Seq)
			if err := lost(s, s.settler.retryCopy(hctx, &d, 0), lineNo); err != nil {
				return err
			}
		}
		if stopping {
			return stopped(lineNo)
		}
	}
}

// msgInvalidLine is logged for an invalid stdin line that is skipped,
// and msgInvalidLeftOut for those the log limit left out.
const (
	msgInvalidLine    = "invalid stdin line skipped"
	msgInvalidLeftOut = "invalid stdin lines skipped since the last line, left out of the log"
)

// msgStoppedReading is logged when a stage stops (SIGTERM, or stdout
// closed) before the end of stdin: the lines it read ahead of the one it
// was at are gone from stdin, and no stage handles them.
const msgStoppedReading = "the stage stopped before the end of stdin: the lines after last_line are not handled, though it may have read some of them ahead; feed the input to a stage again from resume_line"

// pipeCopies publishes a pipe subscription's copies on stdout: now, or
// when their delay has passed.
type pipeCopies struct {
	out          *pipe.Writer
	queue        *retrytimer.Queue
	reading      context.Context // ends when the stage stops reading stdin
	subscription string          // whose copies they are
	progress     *StageProgress  // which lines' copies wait
	// The stage's logger, its max_delayed_mib, and the warning that the
	// delayed copies fill it.
	logger        *slog.Logger
	maxDelayedMiB int
	full          *ratelog.Line
}

func (c pipeCopies) publish(_ context.Context, key string, record []byte) error {
	return c.out.Write(key, record)
}

// schedule waits, while the delayed copies fill max_delayed_mib, until one
// has left: the stage then reads no more input, and the memory stays
// bounded. Once the stage stops reading (a signal, a closed stdout) it
// waits no more: no more input comes, and the copy is drained with the
// others, or counted among the abandoned.
func (c pipeCopies) schedule(key string, record []byte, due time.Time) error {
	if c.queue.Full() {
		c.full.Warn(c.logger, msgDelayedFull, "max_delayed_mib", c.maxDelayedMiB, "delayed_copies", c.queue.Pending())
	}
	if err := c.queue.WaitRoom(c.reading); err != nil && c.reading.Err() == nil {
		return err
	}
	line := c.progress.delay() // not done if it fails: the copy is lost
	return c.queue.Schedule(retrytimer.Copy{Key: key, Record: record, Subscription: c.subscription, Line: line}, due)
}

// msgDelayedFull is logged (at most every 10 s) when a copy to delay waits
// for room: the stage reads no more of stdin meanwhile.
const msgDelayedFull = "the copies delayed by retry_after fill max_delayed_mib: the stage reads no more of stdin until some leave (raise max_delayed_mib, or shorten the delays)"

// warnDevNull warns when out, the stage's stdout, is the null device:
// the copies written there are lost. A stage started with its stdout
// closed (>&-) has it there too, as the Go runtime opens the null device
// for a standard descriptor that is closed.
func warnDevNull(out io.Writer, logger *slog.Logger) {
	f, ok := out.(*os.File)
	if !ok {
		return
	}
	fi, err := f.Stat()
	if err != nil {
		return
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		logger.Warn(msgStdoutDevNull)
	}
}

// msgStdoutDevNull is logged when a stage's stdout is the null device.
const msgStdoutDevNull = "stdout is " + os.DevNull + " (or was closed when the stage started): the retry copies and dead letters written there are lost"
