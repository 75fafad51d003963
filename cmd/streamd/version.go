package main

import (
	"fmt"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"
)

// version.Version is set at build time (the Makefile's -ldflags -X); a
// plain go build is a development build.
func init() {
	if version.Version == "" {
		version.Version = "devel"
	}
}

func versionCommand(app *kingpin.Application) action {
	app.Command("version", "Print version information.")
	return func(s stdio) int {
		fmt.Fprintln(s.out, version.Print("streamd"))
		return exitOK
	}
}
