package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/streamd/streamd/internal/durable"
)

// ReloadName is the file in the state directory where the daemon answers
// each reload, for `streamd reload`, which signalled it, to read.
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
}

// writeReloadResult records the answer to the reload that started at
// started in the state directory.
func writeReloadResult(dir string, started time.Time, reloadErr error) error {
	r := ReloadResult{PID: os.Getpid(), Started: started}
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
