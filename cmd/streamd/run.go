package main

import (
	"context"
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
)

// runDaemon is `streamd run`: the daemon, until SIGTERM or SIGINT. SIGHUP
// reloads the configuration file.
func runDaemon(args []string, s stdio) int {
	fset := flag.NewFlagSet("run", flag.ContinueOnError)
	fset.SetOutput(s.err)
	flags := addDaemonFlags(fset)
	path := flags.path
	fset.Usage = func() {
		fmt.Fprintln(s.err, "usage: streamd run [--config.file=PATH] [--log.level=LEVEL] [--log.format=FORMAT]")
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		return exitUsage
	}
	if fset.NArg() != 0 {
		fmt.Fprintf(s.err, "streamd run: unexpected argument %q\n", fset.Arg(0))
		return exitUsage
	}
	// Register SIGHUP before the slow start, so that an early reload is
	// not the default action (which would kill the process).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	cfg, err := conf.Load(*path, conf.ModeRun)
	if err != nil {
		fmt.Fprintf(s.err, "streamd: couldn't load configuration (--config.file=%q):\n%v\n", *path, err)
		return exitError
	}
	logger, err := flags.logger(cfg)
	if err != nil {
		fmt.Fprintf(s.err, "streamd: %v\n", err)
		return exitUsage
	}
	d := daemon.New(cfg, daemon.Options{
		Logger: logger,
		Stdout: s.out,
		Build:  metrics.BuildInfo{Version: version, Revision: revision(), GoVersion: runtime.Version()},
	})
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				logger.Error("streamd stopped", "err", err)
				return exitError
			}
			return exitOK
		case <-hup:
			// The daemon logs and reports the outcome of the reload.
			d.Reload(ctx, func() (*conf.Config, error) { return conf.Load(*path, conf.ModeRun) })
		}
	}
}

// daemonFlags are the flags that run and pipe share.
type daemonFlags struct {
	path, level, format *string
}

func addDaemonFlags(fset *flag.FlagSet) daemonFlags {
	return daemonFlags{
		path:   fset.String("config.file", conf.DefaultFile(), "configuration file"),
		level:  fset.String("log.level", "", "log level: debug, info, warn or error (default: the file's [log] level)"),
		format: fset.String("log.format", "", "log format: auto, text or json (default: the file's [log] format)"),
	}
}

// logger makes the logger on stderr, the flags winning over the file.
func (f daemonFlags) logger(cfg *conf.Config) (*slog.Logger, error) {
	return daemon.NewLogger(os.Stderr, pick(*f.level, cfg.Log.Level), pick(*f.format, cfg.Log.Format))
}

// pick returns flag when it is set, else the configured value.
func pick(flag, configured string) string {
	if flag != "" {
		return flag
	}
	return configured
}
