package daemon

import (
	"bytes"
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
	// Stopping says the daemon was told to stop during the reload, which
	// had stopped the subscriptions it changed: neither configuration
	// runs any more. Error says so too.
	Stopping bool `json:"stopping,omitempty"`
	// Config is the configuration file the daemon reloads
	// ([Options.ConfigFile]), "" when unknown.
	Config string `json:"config,omitempty"`
}

// writeReloadResult records the answer to the reload that started at
// started in the state directory; at the daemon's start, with a nil
// reloadErr, it names the daemon's configuration file before any reload.
func writeReloadResult(dir, config string, started time.Time, reloadErr error) error {
	r := ReloadResult{PID: os.Getpid(), Started: started, Config: config, Stopping: errors.Is(reloadErr, errStoppedDuringReload)}
	if reloadErr != nil {
		r.Error = reloadErr.Error()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path, line := filepath.Join(dir, ReloadName), append(b, '\n')
	_, err = durable.Replace(path, 0o640, func(f *os.File) error {
		_, err := f.Write(line)
		return err
	}, nil)
	if durable.NoSpace(err) {
		// A full disk: streamd reload waits for this answer, which fits
		// in the place of the one before (written at the start).
		if overwrite(path, line) == nil {
			return nil
		}
	}
	return err
}

// overwrite writes line over the bytes of the file at path, which needs no
// room on the disk while it fits in the file's last block: padded with
// spaces, which JSON ignores, to the file's size, so that a reader never
// sees the file shrink. A reader may see the write half done: it reads
// again (signalReload).
func overwrite(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if pad := fi.Size() - int64(len(line)); pad > 0 {
		line = append(append(line[:len(line)-1:len(line)-1], bytes.Repeat([]byte{' '}, int(pad))...), '\n')
	}
	_, err = f.WriteAt(line, 0)
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
	if r.Stopping {
		fmt.Fprintf(errw, "streamd reload: streamd (pid %d) is stopping: it was told to stop during the reload, and starts neither configuration again:\n%s\n", r.PID, r.Error)
		return false
	}
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
	var unreadable error // the last answer that did not parse
	for {
		r, err := ReadReloadResult(dir)
		_, halfWritten := errors.AsType[*json.SyntaxError](err) // written in place (overwrite): read again
		if halfWritten {
			unreadable = err
		}
		switch {
		case err == nil && r.PID == pid && !r.Started.Before(sent):
			return r, nil
		case err != nil && !errors.Is(err, os.ErrNotExist) && !halfWritten:
			return r, err
		case errors.Is(syscall.Kill(pid, 0), syscall.ESRCH):
			return r, fmt.Errorf("streamd (pid %d) stopped before it answered the reload", pid)
		}
		select {
		case <-tick.C:
		case <-deadline:
			if unreadable != nil {
				return r, fmt.Errorf("streamd (pid %d) did not answer the reload within %s, the last answer read did not parse (%w); see its log", pid, timeout, unreadable)
			}
			return r, fmt.Errorf("streamd (pid %d) did not answer the reload within %s; see its log", pid, timeout)
		}
	}
}
