package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
)

func runCheckConfig(args []string, s stdio) int {
	fset := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fset.SetOutput(s.err)
	path := fset.String("config.file", conf.DefaultFile(), "configuration file to check")
	modeName := fset.String("mode", "run", "the command the file is for: run or pipe")
	handlers := fset.Bool("handlers", false, "also build each handler as streamd does at start on this machine: the exec\ncommand found, bearer_token_file and ca_file read, the proxy from the environment")
	fset.Usage = func() {
		fmt.Fprintln(s.err, "usage: streamd check-config [--config.file=PATH] [--mode=run|pipe] [--handlers]")
		fmt.Fprintln(s.err, "\nChecks a configuration file exactly as streamd run (or pipe) does at start and")
		fmt.Fprintln(s.err, "reload, and writes nothing. Exit 0: valid; 1: invalid; 2: usage or unreadable file.")
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		return exitUsage
	}
	if fset.NArg() != 0 {
		fmt.Fprintf(s.err, "streamd check-config: unexpected argument %q (name the file with --config.file)\n", fset.Arg(0))
		return exitUsage
	}
	var mode conf.Mode
	switch *modeName {
	case "run":
		mode = conf.ModeRun
	case "pipe":
		mode = conf.ModePipe
	default:
		fmt.Fprintf(s.err, "streamd check-config: unknown --mode %q: use run or pipe\n", *modeName)
		return exitUsage
	}

	cfg, err := conf.Load(*path, mode)
	if err == nil && *handlers {
		if err = handler.Check(cfg); err != nil {
			fmt.Fprintf(s.err, "streamd: configuration file %s is valid, but its handlers cannot start here:\n%v\n", *path, err)
			return exitError
		}
	}
	if err == nil {
		fmt.Fprintf(s.out, "streamd: configuration file %s is valid\n", *path)
		return exitOK
	}
	if _, ok := errors.AsType[*fs.PathError](err); ok {
		fmt.Fprintf(s.err, "streamd check-config: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(s.err, "streamd: configuration file %s is invalid:\n", *path)
	if pe, ok := errors.AsType[toml.ParseError](err); ok {
		fmt.Fprint(s.err, strings.TrimRight(pe.ErrorWithPosition(), "\n")+"\n")
	} else {
		fmt.Fprintln(s.err, err)
	}
	return exitError
}
