// Command streamd tails SeaStreamer stream files and hands each record of a
// subscribed stream key to a handler, settling retries as the reference
// runtime does. This file builds the command line; run.go holds the
// commands on a configuration (run, pipe, check-config, reload, offsets),
// file.go those on a stream file (decode, publish, repair). They only
// parse, wire and report: the work is done by the packages they call.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"

	"github.com/streamd/streamd/streamfile"
)

// Exit codes shared by the subcommands.
const (
	exitOK    = 0
	exitError = 1 // the work failed: bad data, a failed write
	exitUsage = 2 // the command line was wrong or a file could not be opened
	// exitNoAnswer is streamd reload's when the daemon did not answer in
	// time: the outcome is not known.
	exitNoAnswer = 3
)

// failureExit is the exit code of a command that failed with err: 2 when
// a file it was given cannot be opened or read (an *os.PathError of those
// operations, or a named pipe or device, not a file to open), 1 for
// anything else, such as a file whose contents are
// wrong or a write, truncate or fsync that failed.
func failureExit(err error) int {
	if _, ok := errors.AsType[*streamfile.NotRegularError](err); ok {
		return exitUsage
	}
	if pe, ok := errors.AsType[*os.PathError](err); ok {
		switch pe.Op {
		case "open", "read", "stat", "lstat":
			return exitUsage
		}
	}
	return exitError
}

// stdio is where a subcommand reads and writes, so tests can run it in
// process.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// exitWith says on s.err what stopped a command, a line of format and
// args, and returns the command's exit code.
func (s stdio) exitWith(code int, format string, args ...any) int {
	fmt.Fprintf(s.err, format+"\n", args...)
	return code
}

// action runs a parsed subcommand and returns its exit code.
type action func(s stdio) int

// terminated is how the command line stops parsing after --help or
// --version printed what was asked: kingpin's Terminate hook panics with
// it, and run recovers the exit code.
type terminated int

func main() {
	signal.Ignore(syscall.SIGPIPE) // a closed stdout is an EPIPE write error, handled where it happens
	os.Exit(run(os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr}))
}

// stopContext returns a context that ends at SIGINT or SIGTERM, the
// signals that stop the commands that run until stopped (run, pipe,
// decode --follow), or at one of more; the channel that receives the
// stop signals after the first (watchStop); and the function that stops
// listening for them. The signals are registered before it returns, so
// that none is lost to the default action or between the two.
func stopContext(more ...os.Signal) (context.Context, <-chan os.Signal, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2) // the first, and one more before the first is taken
	signal.Notify(sigs, append([]os.Signal{syscall.SIGINT, syscall.SIGTERM}, more...)...)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs: // the first; later ones stay in sigs
			cancel()
		case <-done:
		}
	}()
	return ctx, sigs, sync.OnceFunc(func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	})
}

func run(args []string, s stdio) (code int) {
	app := kingpin.New("streamd", "Tails SeaStreamer stream files and hands each record of a subscribed stream key to a handler.")
	usage := &firstErrorWriter{w: s.out}
	app.UsageWriter(usage).ErrorWriter(s.err)
	app.HelpFlag.Short('h')
	app.Version(version.Print("streamd"))
	app.Terminate(func(c int) { panic(terminated(c)) })
	actions := map[string]action{
		"run":          runCommand(app),
		"pipe":         pipeCommand(app),
		"check-config": checkConfigCommand(app),
		"reload":       reloadCommand(app),
		"decode":       decodeCommand(app),
		"publish":      publishCommand(app),
		"repair":       repairCommand(app),
		"version":      versionCommand(app),
	}
	addOffsetsCommands(app, actions)
	if completeCommand(app, args, s.out) {
		return exitOK
	}
	defer func() {
		r := recover()
		if r != nil && usage.err != nil {
			// kingpin stopped after the help or the version, or panicked
			// because it could not write them.
			code = s.outputFailed(usage.err)
		} else if t, ok := r.(terminated); ok {
			code = exitOK
			if t != 0 {
				code = exitUsage
			}
		} else if r != nil {
			panic(r)
		}
	}()
	cmd, err := app.Parse(args)
	if pe, ok := errors.AsType[*os.PathError](err); ok && pe.Op == "write" {
		return s.outputFailed(err) // --help-man or a completion script, written to os.Stdout
	}
	if err != nil {
		name := "streamd"
		if i := commandAfterFlags(app, args); i > 0 {
			// Flags before a command are taken for run's, the default:
			// say where they go when that is all that is wrong.
			reordered := append(slices.Clone(args[i:]), args[:i]...)
			if _, perr := app.Parse(reordered); perr == nil {
				return s.exitWith(exitUsage, "%s: flags go after the command: streamd %s", name, strings.Join(reordered, " "))
			}
		}
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") && app.GetCommand(args[0]) == nil {
			err = fmt.Errorf("unknown command %q", args[0])
		} else if ctx, _ := app.ParseContext(args); ctx != nil && ctx.SelectedCommand != nil {
			name += " " + ctx.SelectedCommand.FullCommand()
		}
		return s.exitWith(exitUsage, "%s: %v; see '%s --help'", name, err, name)
	}
	return actions[cmd](s)
}

// completeCommand answers the completion scripts' question for the
// command word (streamd --completion-bash WORD), which kingpin answers
// with nothing: it takes any first word for an argument of run, the
// default command. It reports whether args were that question.
func completeCommand(app *kingpin.Application, args []string, w io.Writer) bool {
	if len(args) != 2 || args[0] != "--completion-bash" || strings.HasPrefix(args[1], "-") {
		return false
	}
	for _, c := range app.Model().Commands {
		if !c.Hidden && strings.HasPrefix(c.Name, args[1]) {
			fmt.Fprintln(w, c.Name)
		}
	}
	return true
}

// firstErrorWriter writes to w and keeps the first error: kingpin ignores
// those of some of its writes.
type firstErrorWriter struct {
	w   io.Writer
	err error
}

func (f *firstErrorWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if f.err == nil {
		f.err = err
	}
	return n, err
}

// outputFailed is the exit code of a command whose output on stdout
// failed with err: 0 without a word when the reader went away, as in
// streamd --help | head -1; otherwise 1, saying why (a full disk).
func (s stdio) outputFailed(err error) int {
	if errors.Is(err, syscall.EPIPE) {
		return exitOK
	}
	return s.exitWith(exitError, "streamd: cannot write the output: %v", err)
}

// commandAfterFlags returns the index of the first argument that names a
// command when flags come before it, 0 when none does.
func commandAfterFlags(app *kingpin.Application, args []string) int {
	if len(args) == 0 || !strings.HasPrefix(args[0], "-") {
		return 0
	}
	for i, a := range args {
		if a == "--" {
			return 0
		}
		if !strings.HasPrefix(a, "-") && app.GetCommand(a) != nil {
			return i
		}
	}
	return 0
}

// version.Version is set at build time (the Makefile's -ldflags -X); a
// plain go build is a development build.
func init() {
	if version.Version == "" {
		version.Version = "devel"
	}
	kingpin.ManPageTemplate = manPage(kingpin.ManPageTemplate)
}

// manPage returns kingpin's man page template with a title line that roff
// reads (kingpin's writes the version unquoted, and --version's text is
// several lines) and a NAME section that says what streamd is;
// TestManPageAndCompletions sees both, so a kingpin whose template changed
// fails it.
func manPage(tmpl string) string {
	return strings.NewReplacer(
		`.TH {{.App.Name}} 1 {{.App.Version}} "{{.App.Author}}"`, `.TH STREAMD 1 "" "streamd `+version.Version+`" "User Commands"`,
		".SH \"NAME\"\n{{.App.Name}}\n", ".SH \"NAME\"\n{{.App.Name}} \\- {{.App.Help}}\n",
	).Replace(tmpl)
}

func versionCommand(app *kingpin.Application) action {
	app.Command("version", "Print version information.")
	return func(s stdio) int {
		if _, err := fmt.Fprintln(s.out, version.Print("streamd")); err != nil {
			return s.outputFailed(err)
		}
		return exitOK
	}
}
