package main

import (
	"errors"
	"fmt"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/tail"
)

// addOffsetsCommands adds `streamd offsets show` and `streamd offsets
// set`: read or rewrite the stored positions of a configuration's
// subscriptions.
func addOffsetsCommands(app *kingpin.Application, actions map[string]action) {
	cmd := app.Command("offsets", "Show or set the stored positions of subscriptions.")
	show := cmd.Command("show", "Print each subscription's stored position, its stream file's size and the lag.")
	showConfig := configFlag(show, conf.ModeRun, "streamd offsets show")
	set := cmd.Command("set", "Rewind or skip one subscription; refused while the daemon runs.")
	setConfig := configFlag(set, conf.ModeRun, "streamd offsets set")
	name := set.Flag("subscription", "The subscription to move.").Required().String()
	var to tail.Start
	set.Flag("to", "The new position: beginning, end, seq:N, time:RFC3339 or offset:N.").Required().SetText(&to)
	actions[show.FullCommand()] = func(s stdio) int {
		cfg, code := showConfig.load(s)
		if cfg == nil {
			return code
		}
		reports, err := daemon.Positions(cfg)
		if err != nil {
			fmt.Fprintf(s.err, "streamd offsets show: %v\n", err)
			return exitError
		}
		if daemon.WritePositions(s.out, reports) != nil {
			return exitError
		}
		return exitOK
	}
	actions[set.FullCommand()] = func(s stdio) int {
		cfg, code := setConfig.load(s)
		if cfg == nil {
			return code
		}
		pos, err := daemon.SetPosition(cfg, *name, to)
		if err != nil {
			fmt.Fprintf(s.err, "streamd offsets set: %v\n", err)
			if _, unknown := errors.AsType[*daemon.UnknownSubscriptionError](err); unknown {
				return exitUsage
			}
			return exitError
		}
		fmt.Fprintf(s.out, "streamd: subscription %q now resumes at offset %d of %s (%s)\n", *name, pos.Offset, pos.Stream, to)
		return exitOK
	}
}
