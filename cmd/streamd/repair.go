package main

import (
	"fmt"

	"github.com/alecthomas/kingpin/v2"
	"github.com/streamd/streamd/streamfile"
)

// repairCommand is `streamd repair`: truncate a stream file that writers
// refuse (an end-of-stream frame in the middle, damage after the last good
// frame) to its last frame readers reach. It is a command of its own, not a
// publish flag, so that discarding bytes is always an operator's choice
// made once, after reading what is there, never a side effect of a script
// that publishes.
func repairCommand(app *kingpin.Application) action {
	cmd := app.Command("repair", "Truncate a stream file that publish and the daemon refuse to append to (an end-of-stream frame in the middle, "+
		"damage after the last good frame) to its last frame readers reach, saying first what it discards. Stop every writer of the file first.")
	path := cmd.Arg("file", "Stream file to repair.").Required().String()
	return func(s stdio) int {
		de, err := streamfile.Repair(*path, func(de *streamfile.DamageError) {
			fmt.Fprintf(s.out, "%s: readers stop at offset %d: %s\n%s: discarding the %d bytes from offset %d to the end\n",
				*path, de.Offset, de.What, *path, de.Size-de.Offset, de.Offset)
		})
		switch {
		case err != nil:
			fmt.Fprintf(s.err, "streamd repair: %v\n", err)
			return exitError
		case de == nil:
			fmt.Fprintf(s.out, "%s: its records reach its end; nothing to repair\n", *path)
		default:
			fmt.Fprintf(s.out, "%s: truncated to %d bytes; it can be appended to\n", *path, de.Offset)
		}
		return exitOK
	}
}
