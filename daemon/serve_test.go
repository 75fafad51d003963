package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
)

// TestServe: each signal on the reload channel reloads the running daemon
// with load, and the daemon logs the outcome, applied or refused; Serve
// returns what Run returned: nil after a graceful stop, the error of a
// start that failed, even with a reload asked for during that start.
func TestServe(t *testing.T) {
	for _, tc := range []struct {
		name    string
		loads   []error // what load returns at each reload, in turn
		logs    []string
		failRun bool // the state directory is a file: Run fails at start
		early   bool // a reload is asked for before Run gets to its main loop
	}{
		{name: "no reload"},
		{name: "reloads", loads: []error{nil, errors.New("bad file"), nil},
			logs: []string{"configuration reloaded", "reload failed; the previous configuration keeps running", "configuration reloaded"}},
		{name: "start fails", failRun: true},
		{name: "reload during a start that fails", failRun: true, early: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRunEnv(t, runSub("billing", "orders", ""))
			e.put("orders", nil, "a")
			if tc.failRun {
				if err := os.WriteFile(filepath.Join(e.dir, "state"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			logs := &logCapture{}
			d := New(e.load(), Options{Logger: logs.logger(), Handlers: map[string]handler.Handler{"billing": newRecorder(nil)}, Registry: prometheus.NewRegistry()})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			reload := make(chan os.Signal, 1)
			if tc.early {
				reload <- syscall.SIGHUP
			}
			loads := tc.loads
			load := func() (*conf.Config, error) {
				if len(loads) == 0 {
					return e.load(), nil
				}
				err := loads[0]
				loads = loads[1:]
				if err != nil {
					return nil, err
				}
				return e.load(), nil
			}
			done := make(chan error, 1)
			go func() { done <- d.Serve(ctx, reload, load) }()
			for i, msg := range tc.logs {
				reload <- syscall.SIGHUP
				waitFor(t, "reload "+msg, func() bool { return countLogs(logs, tc.logs[:i+1]) })
			}
			if !tc.failRun {
				cancel()
			}
			select {
			case err := <-done:
				if (err != nil) != tc.failRun {
					t.Errorf("Serve returned %v; want an error: %v", err, tc.failRun)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Serve did not return")
			}
		})
	}
}

// countLogs reports whether the logs hold each of the messages of want,
// counted: as many records of a message as want has.
func countLogs(c *logCapture, want []string) bool {
	n := map[string]int{}
	for _, m := range want {
		n[m]++
	}
	for m, k := range n {
		if len(c.with(m)) != k {
			return false
		}
	}
	return true
}
