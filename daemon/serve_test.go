package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
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

// TestReloadAnswersEachRequest: two `streamd reload` at once, the second
// asked while the daemon's reload of the first waits for a delivery in
// flight: the daemon reloads twice, the second time at once after the
// first (a file that does not load), and each client gets the answer to
// its own request, not the last one written. Several rounds, since the
// first client reads its answer at its next poll, which may come before
// the second is written.
func TestReloadAnswersEachRequest(t *testing.T) {
	const rounds = 5
	e := newRunEnv(t, runSub("s", "orders", ""))
	e.shutdownTimeout = "30s"
	e.put("orders", nil, numbered(rounds+1)...)
	var calls atomic.Int32
	release := make(chan struct{})
	h := handler.HandlerFunc(func(ctx context.Context, _ *handler.Delivery) handler.Outcome {
		calls.Add(1)
		select { // in flight until the test releases it
		case <-release:
			return ack
		case <-ctx.Done():
			return handler.Failed(handler.FailureCanceled, ctx.Err())
		}
	})
	var mu sync.Mutex
	var next *conf.Config
	var nextErr error
	loaded := make(chan struct{}, 2) // the second reload loads at once
	load := func() (*conf.Config, error) {
		mu.Lock()
		defer mu.Unlock()
		loaded <- struct{}{}
		return next, nextErr
	}
	setNext := func(cfg *conf.Config, err error) {
		mu.Lock()
		defer mu.Unlock()
		next, nextErr = cfg, err
	}

	hup := make(chan os.Signal, 1) // as streamd run's
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup) // once every client returned
	logs := &logCapture{}
	d := New(e.load(), Options{Logger: logs.logger(), Handlers: map[string]handler.Handler{"s": h}, Registry: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, hup, load) }()
	dir := filepath.Join(e.dir, "state")
	type answer struct {
		r   ReloadResult
		err error
	}
	request := func() <-chan answer {
		c := make(chan answer, 1)
		go func() {
			r, err := RequestReload("", dir, 20*time.Second)
			c <- answer{r, err}
		}()
		return c
	}

	for i := 1; i <= rounds; i++ {
		waitFor(t, fmt.Sprintf("delivery %d in flight", i), func() bool { return calls.Load() == int32(i) })
		e.config = runSub("s", "orders", fmt.Sprintf("max_attempts = %d", i+1)) // changed: the reload waits for the delivery
		setNext(e.load(), nil)
		first := request()
		<-loaded
		setNext(nil, errors.New("bogus_key"))
		second := request()
		waitFor(t, "the second client's signal to wait for the first reload", func() bool { return len(hup) == 1 })
		release <- struct{}{}
		if a := <-first; a.err != nil || a.r.Error != "" {
			t.Fatalf("round %d: the first client got %+v, %v; want the answer to its reload, applied", i, a.r, a.err)
		}
		if a := <-second; a.err != nil || a.r.Error != "bogus_key" {
			t.Fatalf("round %d: the second client got %+v, %v; want the answer to its reload, refused with bogus_key", i, a.r, a.err)
		}
		<-loaded
	}
	close(release) // the last record's delivery ends, for a quick stop
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
