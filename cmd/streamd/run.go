package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/pipe"
)

// stage is what `streamd run` and `streamd pipe` parse and load alike: the
// flags, the configuration for mode, and the logger on stderr.
type stage struct {
	name   string // "streamd" or "streamd pipe", as messages name the command
	path   string
	cfg    *conf.Config
	logger *slog.Logger
	opts   daemon.Options
}

// loadStage parses the flags of run or pipe and loads the configuration.
// It returns an exit code when it failed, having said why on s.err.
func loadStage(args []string, s stdio, mode conf.Mode, usage string) (*stage, int) {
	name := "streamd"
	if mode == conf.ModePipe {
		name = "streamd pipe"
	}
	fset := flag.NewFlagSet(mode.String(), flag.ContinueOnError)
	fset.SetOutput(s.err)
	path := fset.String("config.file", conf.DefaultFile(), "configuration file")
	level := fset.String("log.level", "", "log level: debug, info, warn or error (default: the file's [log] level)")
	format := fset.String("log.format", "", "log format: auto, text or json (default: the file's [log] format)")
	fset.Usage = func() {
		fmt.Fprintln(s.err, "usage: "+usage)
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		return nil, exitUsage
	}
	if fset.NArg() != 0 {
		fmt.Fprintf(s.err, "streamd %s: unexpected argument %q\n", mode, fset.Arg(0))
		return nil, exitUsage
	}
	cfg, err := conf.Load(*path, mode)
	if err != nil {
		fmt.Fprintf(s.err, "%s: couldn't load configuration (--config.file=%q):\n%v\n", name, *path, err)
		return nil, exitError
	}
	logger, err := daemon.NewLogger(os.Stderr, pick(*level, cfg.Log.Level), pick(*format, cfg.Log.Format))
	if err != nil {
		fmt.Fprintf(s.err, "%s: %v\n", name, err)
		return nil, exitUsage
	}
	build := metrics.BuildInfo{Version: version, Revision: revision(), GoVersion: runtime.Version()}
	return &stage{name: name, path: *path, cfg: cfg, logger: logger, opts: daemon.Options{Logger: logger, Build: build}}, exitOK
}

// exit logs why a stage stopped, if it failed, and returns its exit code.
func (st *stage) exit(err error) int {
	if err == nil || errors.Is(err, pipe.ErrClosed) {
		return exitOK
	}
	st.logger.Error(st.name+" stopped", "err", err)
	return exitError
}

// runDaemon is `streamd run`: the daemon, until SIGTERM or SIGINT. SIGHUP
// reloads the configuration file.
func runDaemon(args []string, s stdio) int {
	// Register SIGHUP before the slow start, so that an early reload is
	// not the default action (which would kill the process).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	st, code := loadStage(args, s, conf.ModeRun, "streamd run [--config.file=PATH] [--log.level=LEVEL] [--log.format=FORMAT]")
	if st == nil {
		return code
	}
	st.opts.Stdout = s.out
	d := daemon.New(st.cfg, st.opts)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	for {
		select {
		case err := <-done:
			return st.exit(err)
		case <-hup:
			// The daemon logs and reports the outcome of the reload.
			d.Reload(ctx, func() (*conf.Config, error) { return conf.Load(st.path, conf.ModeRun) })
		}
	}
}

// runPipe is `streamd pipe`: one stage of a shell pipeline. Records come
// as stdio lines on stdin; the only output on stdout is the copies the
// stage publishes; logs go to stderr.
func runPipe(args []string, s stdio) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	st, code := loadStage(args, s, conf.ModePipe, "producer | streamd pipe [--config.file=PATH] | consumer")
	if st == nil {
		return code
	}
	st.opts.Stdout = s.err // the stdout handler must not mix with the copies
	return st.exit(daemon.RunPipe(ctx, st.cfg, daemon.PipeOptions{Options: st.opts, In: s.in, Out: s.out}))
}

// pick returns flag when it is set, else the configured value.
func pick(flag, configured string) string {
	if flag != "" {
		return flag
	}
	return configured
}
