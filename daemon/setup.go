package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/systemd"
	"github.com/streamd/streamd/metrics"
)

// Options are what a program gives the daemon or a pipe stage besides its
// configuration.
type Options struct {
	// Logger receives the logs; nil discards them.
	Logger *slog.Logger
	// LogLevel is the level of Logger's handler, which a reload sets to
	// the new configuration's [log] level; nil leaves the level to the
	// caller.
	LogLevel *slog.LevelVar
	// Stdout is where the stdout handler prints; nil is os.Stdout.
	Stdout io.Writer
	// Handlers replace the configured handler of the subscriptions they
	// name: the Go API for programs that embed the daemon. They stay the
	// caller's: the daemon closes only the handlers it builds.
	Handlers map[string]handler.Handler
	// Registry collects the metrics; nil makes one with the Go and process
	// collectors.
	Registry *prometheus.Registry
	// ConfigFile is the absolute path of the configuration file the daemon
	// reloads, recorded in the state directory at the start so that
	// `streamd reload` refuses to ask it to reload another file; "" when
	// the caller loads the configuration from elsewhere.
	ConfigFile string
}

// newLogger returns the logger writing to w: text with timestamps in a
// terminal, JSON with format "json", and, when w is the journal's stream,
// the journal's form ([systemd.NewJournalHandler]).
func newLogger(w *os.File, level, format string) (*slog.Logger, *slog.LevelVar, error) {
	lvl := new(slog.LevelVar)
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("log level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationString}
	switch {
	case format == "json":
		return slog.New(slog.NewJSONHandler(w, opts)), lvl, nil
	case format != "" && format != "text" && format != "auto":
		return nil, nil, fmt.Errorf("log format %q: use auto, text or json", format)
	case format != "text" && systemd.IsJournalStream(w):
		return slog.New(systemd.NewJournalHandler(w, opts)), lvl, nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), lvl, nil
}

// NewProcessLogger returns newLogger's logger for the process that runs
// the daemon or a pipe stage, and the level it logs at, for
// [Options.LogLevel]. It routes what the standard library logs (net/http:
// a response on an idle connection) to the same log, as a warning.
func NewProcessLogger(w *os.File, level, format string) (*slog.Logger, *slog.LevelVar, error) {
	logger, lvl, err := newLogger(w, level, format)
	if err != nil {
		return nil, nil, err
	}
	log.SetFlags(0)
	log.SetOutput(slog.NewLogLogger(logger.Handler(), slog.LevelWarn).Writer())
	return logger, lvl, nil
}

// durationString writes a duration as Go writes it, "20s", in every log
// format: the JSON handler would write the nanoseconds.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// setup is what `streamd run` and `streamd pipe` build alike: the logger,
// the registry with streamd's metrics, the metrics listener, and the
// handlers of the subscriptions.
type setup struct {
	opts    Options
	logger  *slog.Logger
	reg     *prometheus.Registry
	metrics *metrics.Metrics
}

func newSetup(opts Options) setup {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	reg := opts.Registry
	if reg == nil {
		reg = metrics.NewRegistry()
	}
	return setup{opts: opts, logger: opts.Logger, reg: reg, metrics: metrics.New(reg)}
}

// ownsHandler reports whether the named subscription's handler is built,
// and so closed, here: not one that Options.Handlers gives.
func (s *setup) ownsHandler(name string) bool {
	_, given := s.opts.Handlers[name]
	return !given
}

// newHandler returns the subscription sc of cfg's handler: the one
// Options.Handlers gives, or a new one built from its configuration, a
// build that ctx's end (a stop) ends.
func (s *setup) newHandler(ctx context.Context, cfg *conf.Config, sc conf.Subscription) (handler.Handler, error) {
	if h, ok := s.opts.Handlers[sc.Name]; ok {
		return h, nil
	}
	h, err := handler.New(ctx, sc.Handler, s.opts.Stdout, s.logger.With("subscription", sc.Name))
	if err != nil {
		return nil, handler.Placed(cfg, sc.Name, err)
	}
	return h, nil
}

// newHandlers returns the handlers of subs, subscriptions of cfg
// (newHandler), in their order.
// It builds them at once, each on a goroutine of its own: a nats handler
// whose servers do not answer waits for each of them up to its timeout,
// and a start (READY=1 for systemd) or a reload waits for the slowest
// handler rather than for all in turn. When any fails, it closes those it
// built and returns every failure.
func (s *setup) newHandlers(ctx context.Context, cfg *conf.Config, subs []conf.Subscription) ([]handler.Handler, error) {
	hs := make([]handler.Handler, len(subs))
	errs := make([]error, len(subs))
	var wg sync.WaitGroup
	for i, sc := range subs {
		wg.Go(func() { hs[i], errs[i] = s.newHandler(ctx, cfg, sc) })
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err != nil {
		for i, h := range hs {
			if h != nil {
				s.closeHandler(subs[i].Name, h)
			}
		}
		return nil, err
	}
	return hs, nil
}

// closeHandler closes the named subscription's handler if it was built
// here.
func (s *setup) closeHandler(name string, h handler.Handler) {
	if s.ownsHandler(name) {
		handler.Close(h)
	}
}

// countFired counts a delayed copy that was written when its delay
// passed, under the named subscription (the one that made it, or, in the
// daemon, that took it over by a rename: copyOwner), if it still runs.
func (s *setup) countFired(name string) {
	if sm := s.metrics.Lookup(name); sm != nil {
		sm.RetriesAppended.Inc()
	}
}

// serveMetrics listens on the [metrics] listen address, when it is set, and
// serves /metrics until ctx ends; wg waits for the server to stop. A failure
// to listen, or a bad web configuration file, is an error at once.
func (s *setup) serveMetrics(ctx context.Context, wg *sync.WaitGroup, mc conf.Metrics) error {
	if mc.Listen == "" {
		return nil
	}
	server := metrics.NewServer(mc.Listen, mc.WebConfigFile, s.reg, s.metrics.Health(), s.logger)
	if err := server.Listen(); err != nil {
		return err
	}
	wg.Go(func() {
		if err := server.Run(ctx); err != nil {
			s.logger.Error("metrics server failed", "err", err)
		}
	})
	return nil
}
