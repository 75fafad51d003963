package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/heapfloor"
	"github.com/streamd/streamd/pipe"
	"github.com/streamd/streamd/tail"
)

// configFile is a command's --config.file flag, for the mode it loads in.
type configFile struct {
	path *string
	mode conf.Mode
	name string   // the command, as messages name it
	log  conf.Log // run's and pipe's --log.level and --log.format: those given win over the file's, at the start and at every reload
}

func configFlag(cmd *kingpin.CmdClause, mode conf.Mode, name string) configFile {
	return configFile{path: cmd.Flag("config.file", "Configuration file.").Default(conf.DefaultFile()).String(), mode: mode, name: name}
}

// load loads the file, or says why it cannot on s.err and returns nil and
// the exit code: 2 for a file that cannot be read, 1 for an invalid one.
func (c *configFile) load(s stdio) (*conf.Config, int) {
	cfg, err := c.read()
	if err != nil {
		fmt.Fprintf(s.err, "%s: couldn't load configuration (--config.file=%q):\n%v\n", c.name, *c.path, err)
		return nil, failureExit(err)
	}
	return cfg, exitOK
}

// read loads the file, with the log settings of the command line.
func (c *configFile) read() (*conf.Config, error) {
	cfg, err := conf.Load(*c.path, c.mode)
	if err == nil {
		cfg.Log.Level, cfg.Log.Format = cmp.Or(c.log.Level, cfg.Log.Level), cmp.Or(c.log.Format, cfg.Log.Format)
	}
	return cfg, err
}

// stage is what `streamd run` and `streamd pipe` parse and load alike: the
// flags, the configuration, and the logger on stderr.
type stage struct {
	configFile
	cfg  *conf.Config
	opts daemon.Options
}

// stageFlags declares the flags of run or pipe on cmd.
func stageFlags(cmd *kingpin.CmdClause, mode conf.Mode, name string) *stage {
	st := &stage{configFile: configFlag(cmd, mode, name)}
	cmd.Flag("log.level", "Log level: debug, info, warn or error (default: log.level in the configuration file).").StringVar(&st.log.Level)
	cmd.Flag("log.format", "Log format: auto, text or json (default: log.format in the configuration file).").StringVar(&st.log.Format)
	return st
}

// load loads the configuration and makes the logger. It returns an exit
// code when it failed, having said why on s.err.
func (st *stage) load(s stdio) int {
	var code int
	if st.cfg, code = st.configFile.load(s); st.cfg == nil {
		return code
	}
	logger, level, err := daemon.NewProcessLogger(os.Stderr, st.cfg.Log.Level, st.cfg.Log.Format)
	if err != nil {
		return s.exitWith(exitUsage, "%s: %v", st.name, err)
	}
	st.opts = daemon.Options{Logger: logger, LogLevel: level}
	return exitOK
}

// exit logs why a stage stopped, if it failed, and returns its exit code.
func (st *stage) exit(err error) int {
	if err == nil || errors.Is(err, pipe.ErrClosed) {
		return exitOK
	}
	st.opts.Logger.Error(st.name+" stopped", "err", err)
	return exitError
}

// absPath returns path made absolute, or as it is when the working
// directory is gone.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// keepHeapFloor keeps the garbage collector from running while the heap is
// under heapfloor.Default, unless the operator chose the collector's
// percent (GOGC), and returns the function that stops it.
func keepHeapFloor() (stop func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	return heapfloor.Start(heapfloor.Default)
}

// runCommand is `streamd run`, the default command: the daemon, until
// SIGTERM or SIGINT. SIGHUP reloads the configuration file.
func runCommand(app *kingpin.Application) action {
	st := stageFlags(app.Command("run", "Run the daemon (the default command).").Default(), conf.ModeRun, "streamd")
	return func(s stdio) int {
		// Register SIGHUP before the slow start, so that an early reload
		// is not the default action (which would kill the process).
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		ctx, again, stop := stopContext()
		defer stop()
		if code := st.load(s); code != exitOK {
			return code
		}
		defer keepHeapFloor()()
		st.opts.Stdout = s.out
		st.opts.ConfigFile = absPath(*st.path)
		done := make(chan struct{})
		defer close(done)
		go watchStop(ctx, again, done, st.opts.Logger, stopWatch{
			name: "streamd",
			left: "the records not settled are delivered again at the next start",
		})
		d := daemon.New(st.cfg, st.opts)
		return st.exit(d.Serve(ctx, hup, st.read))
	}
}

// pipeCommand is `streamd pipe`: one stage of a shell pipeline. Records
// come as stdio lines on stdin; the only output on stdout is the copies the
// stage publishes; logs go to stderr.
func pipeCommand(app *kingpin.Application) action {
	st := stageFlags(app.Command("pipe", "Run as one stage of a shell pipeline: producer | streamd pipe | consumer."), conf.ModePipe, "streamd pipe")
	return func(s stdio) int {
		// A closed terminal (SIGHUP) stops a stage as SIGTERM does, rather
		// than killing it with its records in flight and copies delayed;
		// unless it was told to ignore it (nohup).
		var more []os.Signal
		if !signal.Ignored(syscall.SIGHUP) {
			more = append(more, syscall.SIGHUP)
		}
		ctx, again, stop := stopContext(more...)
		defer stop()
		if code := st.load(s); code != exitOK {
			return code
		}
		defer keepHeapFloor()()
		st.opts.Stdout = s.err // the stdout handler must not mix with the copies
		done := make(chan struct{})
		defer close(done)
		progress := new(daemon.StageProgress)
		go watchStop(ctx, again, done, st.opts.Logger, stopWatch{
			name:  "streamd pipe",
			left:  "the copies not written are lost (one being written may be left cut short on stdout, which the next stage takes as a record), and so are the lines after last_line, which may have been read ahead; feed the input to a stage again from resume_line",
			bound: 2*time.Duration(st.cfg.ShutdownTimeout) + stuckGrace,
			attrs: progress.Attrs,
		})
		return st.exit(daemon.RunPipe(ctx, st.cfg, daemon.PipeOptions{Options: st.opts, In: s.in, Out: s.out, Progress: progress}))
	}
}

// stuckGrace is how much longer than its two shutdown_timeout waits (the
// handler in flight, then the delayed copies) a stage may take to stop:
// the exec handler's own wait for its output after it is killed, the
// copies of the records not answered.
const stuckGrace = 5 * time.Second

// stopWatch is how watchStop follows the stop of a command.
type stopWatch struct {
	name  string        // the command, in its logs
	left  string        // what an exit before the end of the stop leaves behind
	bound time.Duration // how long a stop may take; 0: as long as it takes
	attrs func() []any  // more of what an exit leaves behind, for its log line; nil: none
}

// sameStop is how soon after the first a stop signal is taken for the
// same stop: timeout(1), and scripts that kill a process and then its
// group, send the one signal twice at once.
const sameStop = time.Second

// watchStop follows the stop of a command that runs until a signal stops
// it (ctx ends) and returns once the command did (done). It ends the
// process with exit status 1 at a second stop signal (again), sameStop or
// more after the first, for the operator who would not wait for the
// handlers in flight or the delayed copies, and, with a bound, when the
// command has not stopped within it: a pipe stage's write of a copy to a
// stdout that the next stage does not read cannot be interrupted, and its
// stop stays bounded.
func watchStop(ctx context.Context, again <-chan os.Signal, done <-chan struct{}, logger *slog.Logger, w stopWatch) {
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	stopped := time.Now()
	var timeout <-chan time.Time
	if w.bound > 0 {
		t := time.NewTimer(w.bound)
		defer t.Stop()
		timeout = t.C
	}
	var msg string
	var attrs []any
	for msg == "" {
		select {
		case <-done:
			return
		case sig := <-again:
			if time.Since(stopped) >= sameStop { // else sent with the first
				msg, attrs = " exits at a second signal without finishing its stop: ", []any{"signal", sig.String()}
			}
		case <-timeout:
			msg, attrs = " did not stop in time, most likely because a copy's write to stdout waits, which the next stage does not read; exiting: ", []any{"waited", w.bound}
		}
	}
	if w.attrs != nil {
		attrs = append(attrs, w.attrs()...)
	}
	logger.Error(w.name+msg+w.left, attrs...)
	handler.KillCommands()
	os.Exit(exitError)
}

// reloadCommand is `streamd reload`: it signals the daemon that holds the
// lock of the configuration's state directory and waits for its answer, so
// that `systemctl reload` fails when the daemon refuses the new
// configuration. Exit 0: the new configuration runs; 1: it was refused, or
// no daemon runs; 3: the daemon did not answer within --timeout.
func reloadCommand(app *kingpin.Application) action {
	cmd := app.Command("reload", "Ask the running daemon to reload its configuration file and wait for its answer: exit 0 when the new configuration runs, 1 when the daemon refused it (the old one keeps running), 3 when it did not answer within --timeout (it may still apply or refuse it).")
	cf := configFlag(cmd, conf.ModeRun, "streamd reload")
	timeout := cmd.Flag("timeout", "How long to wait for the daemon's answer (less than systemd's 90 s for the unit's ExecReload, so that the reason reaches the journal).").Default("80s").Duration()
	return func(s stdio) int {
		if *timeout <= 0 {
			return s.exitWith(exitUsage, "streamd reload: --timeout=%s: want a positive duration, such as 80s", *timeout)
		}
		// The daemon loads the file itself, and answers why it refuses
		// one: only the state directory, which names the daemon, must be
		// read here.
		dir, err := conf.StateDir(*cf.path)
		if err != nil {
			_, code := cf.load(s) // says what is wrong with the file
			return s.exitWith(cmp.Or(code, exitError), "streamd reload: the state_dir of this file, which names the daemon to ask, cannot be read, so no daemon was asked to reload (a daemon that runs keeps its configuration)")
		}
		r, err := daemon.RequestReload(absPath(*cf.path), dir, *timeout)
		if _, ok := errors.AsType[*daemon.NoAnswerError](err); ok {
			return s.exitWith(exitNoAnswer, "streamd reload: %v", err)
		}
		if err != nil {
			return s.exitWith(exitError, "streamd reload: %v", err)
		}
		if !r.Print(s.out, s.err) {
			return exitError
		}
		return exitOK
	}
}

// checkConfigCommand is `streamd check-config`: the exact startup
// validation of a configuration file, writing nothing. Exit 0: valid; 1:
// invalid; 2: usage or an unreadable file.
func checkConfigCommand(app *kingpin.Application) action {
	cmd := app.Command("check-config", "Check a configuration file exactly as streamd run (or pipe) does at start and reload; write nothing.")
	var c daemon.ConfigCheck
	cmd.Flag("config.file", "Configuration file to check.").Default(conf.DefaultFile()).StringVar(&c.Path)
	cmd.Flag("mode", "The command the file is for: run or pipe.").Default("run").SetText(&c.Mode)
	cmd.Flag("handlers", "Also build each handler as streamd does at start on this machine: the exec command found, bearer_token_file and ca_file read, the proxy from the environment, NATS reached and a JetStream stream capturing the subject; and read the metrics web_config_file with its certificates.").BoolVar(&c.Handlers)
	cmd.Flag("files", "Check the state directory and each stream file as streamd run opens them (--no-files: the file alone, as on another machine).").Default("true").BoolVar(&c.Files)
	cmd.Flag("user", "Judge access for this user (the unit's User=) instead of the one running the check: to the stream files, the state directory and the configuration file, and with --handlers to the files the handlers read and the exec commands.").PlaceHolder("NAME").StringVar(&c.User)
	return func(s stdio) int {
		r, err := c.Run()
		switch {
		case err != nil:
			return s.exitWith(exitUsage, "streamd check-config: --user: %v", err)
		case r.Load != nil && failureExit(r.Load) == exitUsage:
			return s.exitWith(exitUsage, "streamd check-config: %v", r.Load)
		case !r.Print(s.out, s.err, c.Path):
			return exitError
		}
		return exitOK
	}
}

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
			return s.exitWith(exitError, "streamd offsets show: %v", err)
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
			code := exitError
			if _, unknown := errors.AsType[*daemon.UnknownSubscriptionError](err); unknown {
				code = exitUsage
			} else if sfe, ok := errors.AsType[*daemon.StreamFileError](err); ok {
				code = failureExit(sfe.Err) // 2 for a stream file that cannot be opened or read
			}
			return s.exitWith(code, "streamd offsets set: %v", err)
		}
		fmt.Fprintf(s.out, "streamd: subscription %q now resumes at offset %d of %s (%s)\n", *name, pos.Offset, pos.Stream, to)
		return exitOK
	}
}
