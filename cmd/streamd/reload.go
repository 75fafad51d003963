package main

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/offsets"
)

// reloadPoll is how often streamd reload looks for the daemon's answer.
const reloadPoll = 20 * time.Millisecond

// reloadCommand is `streamd reload`: it signals the daemon that holds the
// lock of the configuration's state directory and waits for its answer, so
// that `systemctl reload` fails when the daemon refuses the new
// configuration. Exit 0: the new configuration runs; 1: it was refused, or
// no daemon answered.
func reloadCommand(app *kingpin.Application) action {
	cmd := app.Command("reload", "Ask the running daemon to reload its configuration file and wait for its answer: exit 0 when the new configuration runs, 1 when the daemon refused it (the old one keeps running).")
	cf := configFlag(cmd, conf.ModeRun, "streamd reload")
	timeout := cmd.Flag("timeout", "How long to wait for the daemon's answer.").Default("90s").Duration()
	return func(s stdio) int {
		cfg, code := cf.load(s)
		if cfg == nil {
			return code
		}
		pid, err := offsets.LockHolder(cfg.StateDir)
		if err != nil {
			fmt.Fprintf(s.err, "streamd reload: %v\n", err)
			return exitError
		}
		r, err := signalReload(cfg.StateDir, pid, *timeout)
		switch {
		case err != nil:
			fmt.Fprintf(s.err, "streamd reload: %v\n", err)
			return exitError
		case r.Error != "":
			fmt.Fprintf(s.err, "streamd reload: streamd (pid %d) refused the new configuration; the previous one keeps running:\n%s\n", pid, r.Error)
			return exitError
		}
		fmt.Fprintf(s.out, "streamd reload: streamd (pid %d) runs the new configuration\n", pid)
		return exitOK
	}
}

// signalReload sends SIGHUP to the daemon pid and returns its answer: the
// first reload it records in dir that started after the signal.
func signalReload(dir string, pid int, timeout time.Duration) (daemon.ReloadResult, error) {
	sent := time.Now()
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return daemon.ReloadResult{}, fmt.Errorf("signal streamd (pid %d): %w", pid, err)
	}
	deadline := time.After(timeout)
	tick := time.NewTicker(reloadPoll)
	defer tick.Stop()
	for {
		r, err := daemon.ReadReloadResult(dir)
		switch {
		case err == nil && r.PID == pid && !r.Started.Before(sent):
			return r, nil
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return r, err
		case errors.Is(syscall.Kill(pid, 0), syscall.ESRCH):
			return r, fmt.Errorf("streamd (pid %d) stopped before it answered the reload", pid)
		}
		select {
		case <-tick.C:
		case <-deadline:
			return r, fmt.Errorf("streamd (pid %d) did not answer the reload within %s; see its log", pid, timeout)
		}
	}
}
