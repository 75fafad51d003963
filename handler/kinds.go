package handler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/streamd/streamd/conf"
)

// New builds the handler a subscription's [subscription.handler]
// table configures: http, exec, stdout (which writes to stdout), discard
// or nats.
// cfg is expected to have passed the configuration checks and to carry its
// defaults; what can only fail now (reading bearer_token_file or ca_file,
// finding the exec program, connecting to NATS and finding the stream that
// captures the subject) is an error that names the kind and the option.
// A nil logger discards. ctx bounds the build: once it ends (the daemon
// told to stop), a nats handler still connecting gives up, with an error.
//
// Construction starts no goroutines, except the nats handler's connection. A handler that holds resources (the
// http handler's idle connections, the nats handler's connection) implements [io.Closer]; the caller
// closes it, once no Handle call is running, when it implements it.
func New(ctx context.Context, cfg conf.Handler, stdout io.Writer, logger *slog.Logger) (Handler, error) {
	return build(ctx, cfg, stdout, logger, false)
}

// FilesReadOnce returns the files a handler of cfg reads once, when it is
// built, so that it uses what they held then: a reload builds it again
// once one of them changed. (The nats client reads creds_file, ca_file,
// cert_file and key_file again at each connection.)
func FilesReadOnce(cfg conf.Handler) []string {
	var files []string
	switch cfg.Kind {
	case conf.HandlerHTTP:
		files = []string{cfg.BearerTokenFile, cfg.CAFile}
	case conf.HandlerNATS:
		files = []string{cfg.NkeyFile, cfg.PasswordFile}
	}
	return slices.DeleteFunc(files, func(f string) bool { return f == "" })
}

// OptionError is why a handler cannot be built or serve: the value of one
// option of its table (a file it names unreadable, a server it names not
// answering), which [Placed] finds in the configuration file. Err's
// message names the option.
type OptionError struct {
	Option string // the key in the handler table: ca_file, command, ...
	Err    error
}

// optionErrorf returns an [OptionError] of option whose message is
// "option: " and the format's.
func optionErrorf(option, format string, args ...any) *OptionError {
	return &OptionError{Option: option, Err: fmt.Errorf(option+": "+format, args...)}
}

func (e *OptionError) Error() string { return e.Err.Error() }
func (e *OptionError) Unwrap() error { return e.Err }

// Placed returns err, why the named subscription's handler of cfg cannot
// be built, begun with where cfg's file writes it ([conf.Config.HandlerPlace]):
// the option an [OptionError] names, else the handler table.
func Placed(cfg *conf.Config, subscription string, err error) error {
	var option string
	if oe, ok := errors.AsType[*OptionError](err); ok {
		option = oe.Option
	}
	if place := cfg.HandlerPlace(subscription, option); place != "" {
		return fmt.Errorf("%s: subscription %q: %w", place, subscription, err)
	}
	return fmt.Errorf("subscription %q: %w", subscription, err)
}

// build builds the handler cfg configures. With checking (check-config),
// a nats handler whose servers do not answer is an error rather than a
// handler that waits for them.
func build(ctx context.Context, cfg conf.Handler, stdout io.Writer, logger *slog.Logger, checking bool) (Handler, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "handler", "kind", cfg.Kind)
	var (
		h   Handler
		err error
	)
	switch cfg.Kind {
	case conf.HandlerHTTP:
		h, err = newHTTPHandler(cfg)
	case conf.HandlerExec:
		h, err = newExecHandler(cfg, logger)
	case conf.HandlerStdout:
		h, err = newStdoutHandler(cfg, stdout)
	case conf.HandlerDiscard:
		h = discardHandler{}
	case conf.HandlerNATS:
		h, err = newNATSHandler(ctx, cfg, logger, checking)
	default:
		return nil, fmt.Errorf("unknown handler kind %q: use %s, %s, %s, %s or %s", cfg.Kind, conf.HandlerHTTP, conf.HandlerExec, conf.HandlerStdout, conf.HandlerDiscard, conf.HandlerNATS)
	}
	if err != nil {
		return nil, fmt.Errorf("%s handler: %w", cfg.Kind, err)
	}
	return h, nil
}

// Check builds the handler of each subscription of cfg, as run and
// pipe do at start, and closes it again: the checks that depend on the
// machine rather than the file (an exec command found and executable,
// bearer_token_file and ca_file readable, the proxy the environment names,
// the NATS servers reachable and a JetStream stream capturing the subject).
// It starts nothing and writes nothing. It checks the subscriptions at
// once, each on a goroutine of its own, as the daemon builds their
// handlers, and returns every failure, in their order.
func Check(cfg *conf.Config) error {
	errs := make([]error, len(cfg.Subscriptions))
	var wg sync.WaitGroup
	for i, sc := range cfg.Subscriptions {
		wg.Go(func() {
			h, err := build(context.Background(), sc.Handler, io.Discard, nil, true)
			if err != nil {
				errs[i] = Placed(cfg, sc.Name, err)
				return
			}
			Close(h)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// longDuration matches what time.ParseDuration reads but for its size: a
// duration it refuses only because it does not fit a time.Duration.
var longDuration = regexp.MustCompile(`^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))*$`)

// parseOutcomeDirective reads an outcome a handler names explicitly, in the
// Streamd-Outcome response header (http) or an outcome= line on stdout
// (exec): "ack", "drop", "retry" or "retry_after=<duration>", where the
// duration is written as [time.ParseDuration] reads it ("250ms", "5s") and
// is not negative; one too long for a time.Duration is the longest one. Keywords are lowercase; surrounding spaces and tabs are
// ignored.
func parseOutcomeDirective(s string) (Outcome, error) {
	s = strings.Trim(s, " \t")
	switch s {
	case "ack":
		return Outcome{Kind: OutcomeAck}, nil
	case "drop":
		return Outcome{Kind: OutcomeDrop}, nil
	case "retry":
		return Outcome{Kind: OutcomeRetry}, nil
	}
	if v, ok := strings.CutPrefix(s, "retry_after="); ok {
		d, err := time.ParseDuration(v)
		if err != nil && longDuration.MatchString(v) {
			d, err = math.MaxInt64, nil // more than a time.Duration holds: max_retry_after cuts it
		}
		if err == nil && d >= 0 {
			return Outcome{Kind: OutcomeRetryAfter, Delay: d}, nil
		}
	}
	return Outcome{}, fmt.Errorf("invalid outcome %q: use ack, drop, retry or retry_after=<duration>, as in retry_after=30s", s)
}

// Close releases a handler's resources, if it holds any (it implements
// [io.Closer]). Call it once no Handle call is running.
func Close(h Handler) {
	if c, ok := h.(io.Closer); ok {
		c.Close()
	}
}
