// Command streamd tails SeaStreamer stream files and hands each record of a
// subscribed stream key to a handler, settling retries as the reference
// runtime does. This file dispatches subcommands; each lives in its own file.
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes shared by the subcommands.
const (
	exitOK    = 0
	exitError = 1 // the work failed: bad data, a failed write
	exitUsage = 2 // the command line was wrong or a file could not be opened
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(args []string, stdio stdio) int
}

// stdio is where a subcommand reads and writes, so tests can run it in
// process.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

var commands = []command{
	{"run", "run the daemon (the default command)", runDaemon},
	{"pipe", "run as one stage of a shell pipeline over stdio lines", runPipe},
	{"check-config", "check a configuration file as streamd would load it", runCheckConfig},
	{"decode", "print the records of a stream file", runDecode},
	{"publish", "append stdio-format lines from stdin to a stream file", runPublish},
	{"offsets", "show or set the stored positions of subscriptions", runOffsets},
	{"version", "print version information", runVersion},
}

func main() {
	signal.Ignore(syscall.SIGPIPE) // a closed stdout is an EPIPE write error, handled where it happens
	os.Exit(run(os.Args[1:], stdio{os.Stdin, os.Stdout, os.Stderr}))
}

func run(args []string, s stdio) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && !isHelp(args[0]) {
		return runDaemon(args, s)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(s.out)
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:], s)
		}
	}
	fmt.Fprintf(s.err, "streamd: unknown command %q\n", args[0])
	usage(s.err)
	return exitUsage
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: streamd <command> [flags]")
	fmt.Fprintln(w, "\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'streamd <command> -h' for the flags of a command.")
}
