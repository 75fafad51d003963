package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
)

// checkConfigCommand is `streamd check-config`: the exact startup
// validation of a configuration file, writing nothing. Exit 0: valid; 1:
// invalid; 2: usage or an unreadable file.
func checkConfigCommand(app *kingpin.Application) action {
	cmd := app.Command("check-config", "Check a configuration file exactly as streamd run (or pipe) does at start and reload; write nothing.")
	path := cmd.Flag("config.file", "Configuration file to check.").Default(conf.DefaultFile()).String()
	var mode conf.Mode
	cmd.Flag("mode", "The command the file is for: run or pipe.").Default("run").SetText(&mode)
	handlers := cmd.Flag("handlers", "Also build each handler as streamd does at start on this machine: the exec command found, bearer_token_file and ca_file read, the proxy from the environment.").Bool()
	return func(s stdio) int { return checkConfig(*path, mode, *handlers, s) }
}

func checkConfig(path string, mode conf.Mode, handlers bool, s stdio) int {
	cfg, err := conf.Load(path, mode)
	if err == nil && handlers {
		if err = handler.Check(cfg); err != nil {
			fmt.Fprintf(s.err, "streamd: configuration file %s is valid, but its handlers cannot start here:\n%v\n", path, err)
			return exitError
		}
	}
	if err == nil {
		fmt.Fprintf(s.out, "streamd: configuration file %s is valid\n", path)
		return exitOK
	}
	if _, ok := errors.AsType[*fs.PathError](err); ok {
		fmt.Fprintf(s.err, "streamd check-config: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(s.err, "streamd: configuration file %s is invalid:\n", path)
	if pe, ok := errors.AsType[toml.ParseError](err); ok {
		fmt.Fprint(s.err, strings.TrimRight(pe.ErrorWithPosition(), "\n")+"\n")
	} else {
		fmt.Fprintln(s.err, err)
	}
	return exitError
}
