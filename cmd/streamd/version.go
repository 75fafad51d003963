package main

import (
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "devel"

func runVersion(args []string, s stdio) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(s.err)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	fmt.Fprintf(s.out, "streamd %s (revision %s, %s, %s/%s)\n", version, revision(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}

// revision is the VCS revision the binary was built from, when known.
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" {
				return st.Value
			}
		}
	}
	return "unknown"
}
