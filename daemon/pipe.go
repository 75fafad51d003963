package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/pipe"
	"github.com/streamd/streamd/retrytimer"
)

// maxLineBytes bounds one stdin line; a longer line is invalid.
const maxLineBytes = 16 << 20

// ErrStdoutClosed reports that the next stage of the pipeline closed its
// end: the stage stops, as a producer whose reader went away.
var ErrStdoutClosed = errors.New("stdout was closed by the next stage")

// errEmptyCopy is the reference's refusal to print an empty message
// (settlement.md §8.2).
var errEmptyCopy = errors.New("stdio drops empty lines; an empty message cannot be transmitted")

// PipeOptions are what `streamd pipe` gives RunPipe.
type PipeOptions struct {
	Options
	In  io.Reader
	Out io.Writer
}

// RunPipe runs a pipeline stage: stdio lines from opts.In go to the
// subscriptions of their key; copies leave on opts.Out as stdio lines under
// out_retry (or dead_letter). Nothing is stored. At the end of the input,
// or when ctx ends, the stage waits up to shutdown_timeout for copies still
// delayed; it returns an error if it abandoned some, if stdout closed
// (ErrStdoutClosed), or at an invalid line under on_invalid = "fail".
func RunPipe(ctx context.Context, cfg *conf.Config, opts PipeOptions) (err error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := opts.Registry
	if reg == nil {
		reg = metrics.NewRegistry()
	}
	m := metrics.New(reg, opts.Build)
	// Reading stops when ctx ends or when stdout closes, even under a
	// delayed copy; handlers in flight get until shutdown_timeout.
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	context.AfterFunc(readCtx, func() { time.AfterFunc(time.Duration(cfg.ShutdownTimeout), cancelHandlers) })
	out := &lineWriter{w: opts.Out}
	queue, err := retrytimer.Open(retrytimer.Options{
		Fire: func(_ context.Context, c retrytimer.Copy) error {
			err := out.write(c.Key, c.Headers, c.Payload)
			if errors.Is(err, ErrStdoutClosed) {
				stopReading()
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
	m.CountRetriesPending(queue.Pending)
	subs, err := pipeSubscriptions(cfg, opts.Options, logger, m, pipeCopies{out: out, queue: queue, reading: readCtx})
	if err != nil {
		return err
	}
	defer closePipeHandlers(subs)
	if cfg.Metrics.Listen != "" {
		server := metrics.NewServer(cfg.Metrics.Listen, reg, m.Health(), logger)
		if err := server.Listen(); err != nil {
			return err
		}
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		defer stop()
		go server.Run(sctx)
	}

	qctx, stopQueue := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := queue.Run(qctx); err != nil {
			logger.Error("retry queue failed", "err", err)
		}
	})
	readErr := readLines(readCtx, hctx, opts.In, subs, logger)
	stopQueue()
	wg.Wait()

	if out.isClosed() {
		readErr = ErrStdoutClosed
	}
	if errors.Is(readErr, ErrStdoutClosed) {
		logger.Info("stdout was closed by the next stage; stopping", "pending_copies", queue.Pending())
		return readErr
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(cfg.ShutdownTimeout))
	defer cancel()
	abandoned, derr := queue.Drain(dctx)
	if abandoned > 0 {
		logger.Warn("graceful shutdown timed out; abandoning in-flight continuations", "abandoned", abandoned)
		derr = errors.Join(derr, fmt.Errorf("%d delayed copies abandoned after shutdown_timeout (%s)", abandoned, time.Duration(cfg.ShutdownTimeout)))
	}
	if errors.Is(derr, ErrStdoutClosed) {
		derr = ErrStdoutClosed
	}
	return errors.Join(readErr, derr)
}

// pipeSub is one subscription of a pipe stage.
type pipeSub struct {
	cfg     conf.Subscription
	handler handler.Handler
	own     bool // built here, so closed here; not one of Options.Handlers
	settler *settler
	metrics *metrics.SubscriptionMetrics
}

func pipeSubscriptions(cfg *conf.Config, opts Options, logger *slog.Logger, m *metrics.Metrics, copies copyWriter) ([]*pipeSub, error) {
	stdout := opts.Stdout
	var subs []*pipeSub
	for _, sc := range cfg.Subscriptions {
		h, given := opts.Handlers[sc.Name]
		if !given {
			var err error
			if h, err = handler.New(sc.Handler, stdout, logger); err != nil {
				closePipeHandlers(subs)
				return nil, fmt.Errorf("subscription %q: %w", sc.Name, err)
			}
		}
		sm := m.Subscription(sc.Name, "stdin")
		sm.SetHealthy(true, "")
		sublog := logger.With("subscription", sc.Name)
		subs = append(subs, &pipeSub{cfg: sc, handler: h, own: !given, metrics: sm, settler: newSettler(sc, copies, sm, sublog, false)})
	}
	return subs, nil
}

// closePipeHandlers closes the handlers the stage built.
func closePipeHandlers(subs []*pipeSub) {
	for _, s := range subs {
		if s.own {
			handler.Close(s.handler)
		}
	}
}

// readLines reads stdin to its end (or until ctx ends) and hands each line
// to the subscriptions of its key, one line at a time.
func readLines(ctx, hctx context.Context, in io.Reader, subs []*pipeSub, logger *slog.Logger) error {
	failOnInvalid := false
	for _, s := range subs {
		failOnInvalid = failOnInvalid || s.cfg.OnInvalid == "fail"
	}
	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() {
		readErr <- scanLines(in, lines)
		close(lines)
	}()
	var seqs pipe.Sequencer
	var d handler.Delivery
	for lineNo := 1; ; lineNo++ {
		var line []byte
		var ok bool
		select {
		case line, ok = <-lines:
		case <-ctx.Done():
			return nil
		}
		if !ok {
			return <-readErr
		}
		if ctx.Err() != nil {
			return nil // stopped: a line taken at the same time is not handled
		}
		l, err := pipe.ParseLine(line)
		if err != nil {
			for _, s := range subs {
				s.metrics.ReadErrors[metrics.ReasonInvalidLine].Inc()
			}
			if failOnInvalid {
				return fmt.Errorf("stdin line %d: %w (on_invalid = \"fail\")", lineNo, err)
			}
			logger.Warn("invalid stdin line skipped", "line", lineNo, "err", err)
			continue
		}
		key, shard, seq := seqs.Assign(&l)
		payload := bytes.TrimSpace(l.Payload)
		for _, s := range subs {
			if l.HasStreamKey && s.cfg.Key != key {
				continue
			}
			s.metrics.RecordsRead.Inc()
			s.metrics.ReadBytes.Add(float64(len(line) + 1))
			headers, body := envelope.Decode(payload)
			headers.SetSequence(seq)
			ts := l.Timestamp
			if !l.HasTimestamp {
				ts = time.Now()
			}
			d = handler.Delivery{Subscription: s.cfg.Name, Key: key, Shard: shard, Seq: seq, TimestampMs: uint64(ts.UnixMilli()),
				Headers: headers, Payload: body, Attempt: envelope.RetryCount(headers) + 1}
			start := time.Now()
			o := s.handler.Handle(hctx, &d)
			s.metrics.HandlerDuration.Observe(time.Since(start).Seconds())
			if err := s.settler.settle(hctx, &d, o); err != nil {
				if errors.Is(err, ErrStdoutClosed) {
					return ErrStdoutClosed
				}
				logger.Warn("publishing the retry copy failed; message lost", "subscription", s.cfg.Name, "destination", s.settler.retryKey, "err", err)
			}
		}
	}
}

// scanLines sends each line of in, without its '\n', to lines.
func scanLines(in io.Reader, lines chan<- []byte) error {
	r := bufio.NewReaderSize(in, 64<<10)
	var long []byte
	for {
		chunk, err := r.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			if len(long)+len(chunk) > maxLineBytes {
				return fmt.Errorf("stdin line longer than %d bytes", maxLineBytes)
			}
			long = append(long, chunk...)
			continue
		case err != nil && !errors.Is(err, io.EOF):
			return fmt.Errorf("read stdin: %w", err)
		}
		line := chunk
		if long != nil {
			line = append(long, chunk...)
			long = nil
		}
		if len(line) > 0 || err == nil {
			lines <- bytes.Clone(bytes.TrimSuffix(line, []byte("\n")))
		}
		if err != nil {
			return nil
		}
	}
}

// lineWriter prints copies on stdout in the upstream producer's format,
// one whole line per write.
type lineWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prod   pipe.Producer
	buf    []byte
	closed bool // a write found stdout closed
}

func (lw *lineWriter) isClosed() bool {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.closed
}

func (lw *lineWriter) write(key string, h envelope.Headers, payload []byte) error {
	if len(h) == 0 && len(payload) == 0 {
		return errEmptyCopy
	}
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.closed {
		return ErrStdoutClosed
	}
	line, printed, err := lw.prod.Append(lw.buf[:0], time.Now(), key, envelope.Encode(h, payload, true))
	if err != nil {
		return err
	}
	lw.buf = line
	if !printed {
		return errEmptyCopy
	}
	if _, err := lw.w.Write(line); err != nil {
		if errors.Is(err, syscall.EPIPE) {
			lw.closed = true
			return ErrStdoutClosed
		}
		return fmt.Errorf("write stdout: %w", err)
	}
	return nil
}

// pipeCopies publishes a pipe subscription's copies on stdout: now, or
// when their delay has passed.
type pipeCopies struct {
	out     *lineWriter
	queue   *retrytimer.Queue
	reading context.Context // ends when the stage stops reading stdin
}

func (c pipeCopies) publish(_ context.Context, key string, h envelope.Headers, payload []byte) error {
	return c.out.write(key, h, payload)
}

// schedule waits, while the delayed copies fill max_delayed_mib, until one
// has left: the stage then reads no more input, and the memory stays
// bounded. Once the stage stops reading (a signal, a closed stdout) it
// waits no more: no more input comes, and the copy is drained with the
// others, or counted among the abandoned.
func (c pipeCopies) schedule(key string, h envelope.Headers, payload []byte, due time.Time) error {
	if err := c.queue.WaitRoom(c.reading); err != nil && c.reading.Err() == nil {
		return err
	}
	return c.queue.Schedule(retrytimer.Copy{Key: key, Headers: h, Payload: payload}, due)
}
