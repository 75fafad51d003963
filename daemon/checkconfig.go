package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/metrics"
)

// ConfigCheck is what `streamd check-config` checks of a configuration
// file: that it loads for Mode exactly as start and reload load it, and,
// as asked, that its files and handlers would serve on this machine. It
// writes nothing, so it can run beside a daemon that uses the same files.
type ConfigCheck struct {
	// Path is the configuration file.
	Path string
	// Mode is the command the file is for.
	Mode conf.Mode
	// Files checks the state directory and each stream file as run opens
	// them (checkFiles); the pipe stage has neither, so it applies to
	// ModeRun only.
	Files bool
	// Handlers builds each handler as start does ([handler.Check]) and
	// reads the metrics web configuration file with its certificates.
	Handlers bool
	// User is the account whose access to the files is judged, the unit's
	// User=; "" is the account running the check. Another account's is
	// judged also for the configuration file, and, with Handlers, for the
	// files the handlers and the metrics server read and the exec
	// commands.
	User string
}

// ConfigReport is what a [ConfigCheck] found. The file serves when every
// error is nil.
type ConfigReport struct {
	// Account is whose access to the files was judged.
	Account Account
	// Load is why the file did not load: a *fs.PathError when it cannot
	// be read, otherwise its problems (see [conf.Detail]). The other
	// checks need a loaded file and were not made.
	Load error
	// Files is what keeps Account from using the files; nil when nothing
	// does or when they were not checked.
	Files error
	// Handlers is why a handler, or the metrics web configuration, cannot
	// start here; nil when they can or when they were not checked.
	Handlers error
}

// Run makes the check. Its error is a User that names no account on this
// machine, found before anything else is checked.
func (c ConfigCheck) Run() (ConfigReport, error) {
	var r ConfigReport
	if c.User == "" {
		r.Account = self()
	} else {
		var err error
		if r.Account, err = lookupAccount(c.User); err != nil {
			return r, err
		}
	}
	cfg, err := conf.Load(c.Path, c.Mode)
	if err != nil {
		r.Load = err
		return r, nil
	}
	if c.Files && c.Mode == conf.ModeRun {
		r.Files = checkFiles(cfg, r.Account)
	}
	if c.Files && c.User != "" {
		r.Files = errors.Join(r.Files, checkUserFiles(cfg, c.Path, c.Handlers, r.Account))
	}
	if c.Handlers {
		r.Handlers = errors.Join(handler.Check(cfg), checkListen(cfg, net.ResolveTCPAddr), metrics.CheckWebConfig(cfg.Metrics.WebConfigFile))
	}
	return r, nil
}

// Print says what r found of the configuration file at path, as `streamd
// check-config` reports it: on out that it is valid, or on errw why it is
// invalid or cannot serve here. It reports whether the file serves.
func (r ConfigReport) Print(out, errw io.Writer, path string) bool {
	if r.Load != nil {
		fmt.Fprintf(errw, "streamd: configuration file %s is invalid:\n%s\n", path, conf.Detail(r.Load))
		return false
	}
	if r.Files != nil {
		fmt.Fprintf(errw, "streamd: configuration file %s is valid, but streamd run cannot use its files as user %s:\n%v\n", path, r.Account.Name, r.Files)
	}
	if r.Handlers != nil {
		fmt.Fprintf(errw, "streamd: configuration file %s is valid, but it cannot start here:\n%v\n", path, r.Handlers)
	}
	if r.Files != nil || r.Handlers != nil {
		return false
	}
	fmt.Fprintf(out, "streamd: configuration file %s is valid\n", path)
	return true
}

// checkListen resolves the host of the metrics listen address of cfg with
// resolve (net.ResolveTCPAddr; a fake in tests), as run does before it
// listens there, without opening the port: a name that does not resolve
// stops run at its start. [conf.Load] checks only that the host is an IP
// address or a name, reading no network.
func checkListen(cfg *conf.Config, resolve func(network, addr string) (*net.TCPAddr, error)) error {
	if cfg.Metrics.Listen == "" {
		return nil
	}
	if _, err := resolve("tcp", cfg.Metrics.Listen); err != nil {
		err = fmt.Errorf("metrics.listen: %w: streamd run could not listen there; use an address of this machine, as in 127.0.0.1:9464, or a name that resolves to one", err)
		if place := cfg.Place("metrics", "listen"); place != "" {
			return fmt.Errorf("%s: %w", place, err)
		}
		return err
	}
	return nil
}
