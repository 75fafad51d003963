package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	// Requests are the ids of the `streamd reload` requests the reload
	// answers: those waiting in the state directory when it started, so
	// before it read the file (a reload answers all it finds). Never nil
	// in a daemon's answers (empty when none waited); nil in those of a
	// streamd that takes no requests, which RequestReload matches by
	// Started.
	Requests []string `json:"requests"`
	// Earlier are the daemon's last answers before this one that answered
	// requests, newest first, at most keepAnswers: for the clients of
	// reloads at once that read the file only after the next answer.
	Earlier []ReloadResult `json:"earlier,omitempty"`
}

// reloadRequestPrefix begins the name of the file, in the state directory,
// of a `streamd reload` request waiting for its answer; its id follows.
const reloadRequestPrefix = "reload.request."

// keepAnswers is how many earlier answers to requests reload.json keeps.
const keepAnswers = 16

// reloadRequests returns the ids of the `streamd reload` requests waiting
// in the state directory dir, never nil: the reload that starts answers
// them.
func reloadRequests(dir string) ([]string, error) {
	ids := []string{}
	entries, err := os.ReadDir(dir)
	for _, e := range entries {
		if id, ok := strings.CutPrefix(e.Name(), reloadRequestPrefix); ok {
			ids = append(ids, id)
		}
	}
	if err != nil {
		err = fmt.Errorf("reading the streamd reload requests in %s, which wait for this reload's answer until their timeout: %w", dir, err)
	}
	return ids, err
}

// writeReloadResult records the answer to the reload that started at
// started, and to the requests it found then, in the state directory,
// keeping the earlier answers to requests; then it removes the requests'
// files, which tells their clients the answer is written. At the daemon's
// start, with no requests and a nil reloadErr, it names the daemon's
// configuration file before any reload.
func writeReloadResult(dir, config string, started time.Time, requests []string, reloadErr error) error {
	r := ReloadResult{PID: os.Getpid(), Started: started, Config: config, Stopping: errors.Is(reloadErr, errStoppedDuringReload) || errors.Is(reloadErr, errStoppedWhileBuilding), Requests: requests}
	if reloadErr != nil {
		r.Error = reloadErr.Error()
	}
	if prev, err := ReadReloadResult(dir); err == nil && prev.PID == r.PID {
		for _, a := range append([]ReloadResult{prev}, prev.Earlier...) {
			if len(a.Requests) > 0 && len(r.Earlier) < keepAnswers {
				a.Earlier = nil
				r.Earlier = append(r.Earlier, a)
			}
		}
	}
	defer func() {
		for _, id := range requests {
			os.Remove(filepath.Join(dir, reloadRequestPrefix+id))
		}
	}()
	path := filepath.Join(dir, ReloadName)
	_, err := durable.Replace(path, 0o640, func(f *os.File) error {
		return json.NewEncoder(f).Encode(r)
	}, nil)
	if durable.NoSpace(err) {
		// A full disk: streamd reload waits for this answer, which fits
		// in the place of the one before (written at the start), without
		// the earlier ones.
		r.Earlier = nil
		if b, merr := json.Marshal(r); merr == nil && overwrite(path, append(b, '\n')) == nil {
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

// NoAnswerError is RequestReload's error when the daemon did not answer
// within the timeout: the reload was asked for, and its outcome is not
// known. The daemon may still be building the new configuration's
// handlers (a nats one waits for each server that does not answer), and
// apply or refuse it after the caller gave up.
type NoAnswerError struct {
	PID        int
	Timeout    time.Duration
	Dir        string // the state directory, where the answer will be
	Unreadable error  // why the last answer read did not parse, if one did not
}

func (e *NoAnswerError) Error() string {
	msg := fmt.Sprintf("streamd (pid %d) did not answer the reload within %s: it may still apply or refuse it; "+
		"its answer will be in %s and its log, and streamd_config_last_reload_successful tells the outcome "+
		"(a longer --timeout waits for it)", e.PID, e.Timeout, filepath.Join(e.Dir, ReloadName))
	if e.Unreadable != nil {
		msg += fmt.Sprintf("; the last answer read did not parse: %v", e.Unreadable)
	}
	return msg
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

// answerTo returns the answer, r or one of r.Earlier, of the daemon pid to
// the request id, which a `streamd reload` made at sent; or, from a
// streamd that takes no requests, the first answer that started after
// sent.
func (r ReloadResult) answerTo(pid int, id string, sent time.Time) (ReloadResult, bool) {
	for _, a := range append([]ReloadResult{r}, r.Earlier...) {
		if a.PID == pid && (slices.Contains(a.Requests, id) || a.Requests == nil && !a.Started.Before(sent)) {
			a.Earlier = nil
			return a, true
		}
	}
	return ReloadResult{}, false
}

// signalReload leaves a request in dir and sends SIGHUP to the daemon pid,
// and returns its answer to the request: the one naming it, written by the
// first reload that started after the request was left (a reload that
// started before gets the next signal).
func signalReload(dir string, pid int, timeout time.Duration) (ReloadResult, error) {
	id := rand.Text()
	request := filepath.Join(dir, reloadRequestPrefix+id)
	f, err := os.OpenFile(request, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return ReloadResult{}, fmt.Errorf("streamd (pid %d) was not asked to reload: leaving the request in its state directory: %w (run streamd reload as the daemon's user or root)", pid, err)
	}
	f.Close()
	defer os.Remove(request) // when not answered
	sent := time.Now()
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return ReloadResult{}, fmt.Errorf("signal streamd (pid %d): %w", pid, err)
	}
	deadline := time.After(timeout)
	tick := time.NewTicker(reloadPoll)
	defer tick.Stop()
	var unreadable error // the last answer that did not parse
	for {
		// The daemon removes the request once it wrote the answer: one
		// gone before the answers are read is among them.
		_, serr := os.Stat(request)
		taken := errors.Is(serr, os.ErrNotExist)
		r, err := ReadReloadResult(dir)
		_, halfWritten := errors.AsType[*json.SyntaxError](err) // written in place (overwrite): read again
		if halfWritten {
			unreadable = err
		}
		if err == nil {
			if a, ok := r.answerTo(pid, id, sent); ok {
				return a, nil
			}
		}
		switch {
		case err == nil && taken:
			return r, fmt.Errorf("streamd (pid %d) took the reload request, but its answer is not in %s: it could not write it, or more than %d reloads answered other requests since; see its log", pid, filepath.Join(dir, ReloadName), keepAnswers)
		case err != nil && !errors.Is(err, os.ErrNotExist) && !halfWritten:
			return r, err
		case errors.Is(syscall.Kill(pid, 0), syscall.ESRCH):
			return r, fmt.Errorf("streamd (pid %d) stopped before it answered the reload", pid)
		}
		select {
		case <-tick.C:
		case <-deadline:
			return r, &NoAnswerError{PID: pid, Timeout: timeout, Dir: dir, Unreadable: unreadable}
		}
	}
}
