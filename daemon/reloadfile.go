package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/offsets"
)

// ReloadName is the file in the state directory where the daemon answers
// each reload, for `streamd reload`, which signalled it, to read. The
// daemon writes it at the start too, naming its configuration file.
const ReloadName = "reload.json"

// ReloadResult is the daemon's answer to a reload.
type ReloadResult struct {
	// PID is the daemon's process.
	PID int `json:"pid"`
	// Started is when the daemon began the reload, after the signal that
	// asked for it arrived: a `streamd reload` waits for one that started
	// no earlier than its signal.
	Started time.Time `json:"started"`
	// Error is why the new configuration was refused, "" when it runs.
	Error string `json:"error,omitempty"`
	// Config is the configuration file the daemon reloads
	// ([Options.ConfigFile]), "" when unknown.
	Config string `json:"config,omitempty"`
}

// writeReloadResult records the answer to the reload that started at
// started in the state directory; at the daemon's start, with a nil
// reloadErr, it names the daemon's configuration file before any reload.
func writeReloadResult(dir, config string, started time.Time, reloadErr error) error {
	r := ReloadResult{PID: os.Getpid(), Started: started, Config: config}
	if reloadErr != nil {
		r.Error = reloadErr.Error()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = durable.Replace(filepath.Join(dir, ReloadName), 0o640, func(f *os.File) error {
		_, err := f.Write(append(b, '\n'))
		return err
	}, nil)
	return err
}

// ReadReloadResult reads the answer to the last reload the daemon on the
// state directory dir made.
func ReadReloadResult(dir string) (ReloadResult, error) {
	var r ReloadResult
	b, err := os.ReadFile(filepath.Join(dir, ReloadName))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%s: %w", filepath.Join(dir, ReloadName), err)
	}
	return r, nil
}

// reloadPoll is how often RequestReload looks for the daemon's answer.
const reloadPoll = 20 * time.Millisecond

// RequestReload asks the daemon that holds the lock of the state directory
// dir to reload its configuration (SIGHUP), and waits up to timeout for
// its answer: `streamd reload --config.file=config`, which systemd's
// ExecReload runs. It returns the daemon's answer; an error when no daemon
// holds the lock, when the daemon reloads another file than config (it
// would report the other file's outcome), or when none answered.
func RequestReload(config, dir string, timeout time.Duration) (ReloadResult, error) {
	pid, err := offsets.LockHolder(dir)
	if err != nil {
		return ReloadResult{}, fmt.Errorf("%w (the file's state_dir names the daemon to ask: one that runs with another state_dir needs a restart to change it)", err)
	}
	if r, err := ReadReloadResult(dir); err == nil && r.PID == pid && r.Config != "" && !sameFile(r.Config, config) {
		return ReloadResult{}, fmt.Errorf("streamd (pid %d) runs the configuration file %s, not %s, and a reload reads its own file: edit that one and reload, or restart streamd with --config.file=%s; it was not asked to reload", pid, r.Config, config, config)
	}
	return signalReload(dir, pid, timeout)
}

// sameFile reports whether the paths a and b name the same file, or cannot
// both be examined (the daemon then says what is wrong with its own).
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return true
	}
	fb, err := os.Stat(b)
	return err != nil || os.SameFile(fa, fb)
}

// Print says what the daemon answered, as `streamd reload` reports it: on
// out that it runs the new configuration, or on errw why it refused it. It
// reports whether the new configuration runs.
func (r ReloadResult) Print(out, errw io.Writer) bool {
	if r.Error != "" {
		fmt.Fprintf(errw, "streamd reload: streamd (pid %d) refused the new configuration; the previous one keeps running:\n%s\n", r.PID, r.Error)
		return false
	}
	fmt.Fprintf(out, "streamd reload: streamd (pid %d) runs the new configuration\n", r.PID)
	return true
}

// signalReload sends SIGHUP to the daemon pid and returns its answer: the
// first reload it records in dir that started after the signal.
func signalReload(dir string, pid int, timeout time.Duration) (ReloadResult, error) {
	sent := time.Now()
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return ReloadResult{}, fmt.Errorf("signal streamd (pid %d): %w", pid, err)
	}
	deadline := time.After(timeout)
	tick := time.NewTicker(reloadPoll)
	defer tick.Stop()
	for {
		r, err := ReadReloadResult(dir)
		switch {
		case err == nil && r.PID == pid && !r.Started.Before(sent):
			return r, nil
		case err != nil && !errors.Is(err, os.ErrNotExist):
			return r, err
		case errors.Is(syscall.Kill(pid, 0), syscall.ESRCH):
			return r, fmt.Errorf("streamd (pid %d) stopped before it answered the reload", pid)
		}
		select {
		case <-tick.C:
		case <-deadline:
			return r, fmt.Errorf("streamd (pid %d) did not answer the reload within %s; see its log", pid, timeout)
		}
	}
}
