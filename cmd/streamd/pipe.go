package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/pipe"
)

// runPipe is `streamd pipe`: one stage of a shell pipeline. Records come
// as stdio lines on stdin; the only output on stdout is the copies the
// stage publishes; logs go to stderr.
func runPipe(args []string, s stdio) int {
	fset := flag.NewFlagSet("pipe", flag.ContinueOnError)
	fset.SetOutput(s.err)
	flags := addDaemonFlags(fset)
	path := flags.path
	fset.Usage = func() {
		fmt.Fprintln(s.err, "usage: producer | streamd pipe [--config.file=PATH] | consumer")
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		return exitUsage
	}
	if fset.NArg() != 0 {
		fmt.Fprintf(s.err, "streamd pipe: unexpected argument %q\n", fset.Arg(0))
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := conf.Load(*path, conf.ModePipe)
	if err != nil {
		fmt.Fprintf(s.err, "streamd pipe: couldn't load configuration (--config.file=%q):\n%v\n", *path, err)
		return exitError
	}
	logger, err := flags.logger(cfg)
	if err != nil {
		fmt.Fprintf(s.err, "streamd pipe: %v\n", err)
		return exitUsage
	}
	err = daemon.RunPipe(ctx, cfg, daemon.PipeOptions{
		Options: daemon.Options{
			Logger: logger,
			Stdout: s.err,
			Build:  metrics.BuildInfo{Version: version, Revision: revision(), GoVersion: runtime.Version()},
		},
		In:  s.in,
		Out: s.out,
	})
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, pipe.ErrClosed):
		return exitOK
	}
	logger.Error("streamd pipe stopped", "err", err)
	return exitError
}
