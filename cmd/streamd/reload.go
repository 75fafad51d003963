package main

import (
	"fmt"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
)

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
		pid, r, err := daemon.RequestReload(cfg.StateDir, *timeout)
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
