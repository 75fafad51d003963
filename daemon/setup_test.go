package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/natstest"
)

// TestNewHandlersAtOnce: the handlers of a start or a reload are built at
// once, so that nats handlers whose servers do not answer delay the start
// by one timeout, not by one each.
func TestNewHandlersAtOnce(t *testing.T) {
	silent := natstest.StartSilent(t)
	cfg := conf.Handler{Kind: conf.HandlerNATS, URL: silent.URL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second)}
	s := newSetup(Options{})
	subs := []conf.Subscription{{Name: "a", Handler: cfg}, {Name: "b", Handler: cfg}}
	hs, err := s.newHandlers(t.Context(), &conf.Config{Subscriptions: subs}, subs)
	if err != nil {
		t.Fatalf("newHandlers: %v (handlers whose servers do not answer start waiting for them)", err)
	}
	for _, h := range hs {
		handler.Close(h)
	}
	// One after the other, the second would come after the first's timeout.
	if at := silent.Accepts(); len(at) != 2 || at[1].Sub(at[0]) > 500*time.Millisecond {
		t.Errorf("connections at %v, want 2 at once", at)
	}
}

// TestStopWhileHandlersConnect: a daemon told to stop while a nats handler
// waits for a server that accepts and never answers stops at once, with
// no error, rather than after the handler's timeout.
func TestStopWhileHandlersConnect(t *testing.T) {
	silent := natstest.StartSilent(t)
	dir := t.TempDir()
	orders := filepath.Join(dir, "orders.ss")
	cfg, err := loadTestConfig(t, fmt.Sprintf("state_dir = %q\n[metrics]\nlisten = \"\"\n[[stream]]\nname = \"orders\"\npath = %q\n"+
		"[[subscription]]\nname = \"billing\"\nstream = \"orders\"\nkey = \"orders\"\n[subscription.handler]\nkind = \"nats\"\nurl = %q\nsubject = \"orders.eu\"\ntimeout = \"1m\"\n",
		filepath.Join(dir, "state"), orders, silent.URL()), conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	d := New(cfg, Options{Registry: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitFor(t, "the handler connecting", func() bool { return len(silent.Accepts()) > 0 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want a stop without error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after its context ended: it waits for the handler's timeout (1m)")
	}
}

// TestStopWhileReloadBuildsHandlers: a daemon told to stop while a reload
// builds a nats handler whose server accepts and never answers stops at
// once, and says the reload was abandoned, not that it failed with the
// previous configuration running on.
func TestStopWhileReloadBuildsHandlers(t *testing.T) {
	e := newRunEnv(t, runSub("s", "orders", ""))
	r := e.start(nil)
	waitFor(t, "the daemon running", func() bool { return len(r.logs.with("streamd running")) == 1 })
	silent, reloaded := reloadToSilentNATS(t, e, r)
	waitFor(t, "the handler connecting", func() bool { return len(silent.Accepts()) > 0 })
	stopDuringBuild(t, r, reloaded)
	if res, err := ReadReloadResult(filepath.Join(e.dir, "state")); err != nil || !res.Stopping {
		t.Errorf("reload.json %+v (%v): want the answer of a daemon stopping, not of a refusal", res, err)
	}
	if len(r.logs.with("reload abandoned: the daemon was told to stop while it built the handlers of the new configuration; it stops with the previous one")) != 1 ||
		len(r.logs.with("reload failed; the previous configuration keeps running")) != 0 {
		t.Fatalf("the log does not say the reload was abandoned:\n%s", logLines(r.logs.all()))
	}
}

// reloadToSilentNATS starts a reload of r, the daemon of e, that adds a
// subscription whose nats handler's server accepts and never answers
// (timeout 1m), and returns the server and where the reload answers.
func reloadToSilentNATS(t *testing.T, e *runEnv, r *runningDaemon) (*natstest.Silent, <-chan error) {
	silent := natstest.StartSilent(t)
	e.config += fmt.Sprintf("\n[[subscription]]\nname = \"n\"\nstream = \"orders\"\nkey = \"orders\"\n[subscription.handler]\nkind = \"nats\"\nurl = %q\nsubject = \"orders.eu\"\ntimeout = \"1m\"\n", silent.URL())
	cfg := e.load()
	reloaded := make(chan error, 1)
	go func() { reloaded <- r.d.Reload(t.Context(), func() (*conf.Config, error) { return cfg, nil }) }()
	return silent, reloaded
}

// stopDuringBuild stops r while its reload, which answers on reloaded,
// builds a handler that waits 1m, and checks that the reload answers at
// once, not success, and that Run returns no error.
func stopDuringBuild(t *testing.T, r *runningDaemon, reloaded <-chan error) {
	t.Helper()
	r.cancel()
	select {
	case err := <-reloaded:
		if err == nil {
			t.Error("the reload answered success")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reload did not answer 10s after the stop: it waits for the handler's timeout (1m)")
	}
	if err := r.wait(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// spooledCopy returns a run env whose subscription billing, on stream
// orders, with the TOML keys extra, made a copy delayed by a second, left
// in the retry spool by a first run, stopped.
func spooledCopy(t *testing.T, extra string) *runEnv {
	t.Helper()
	e := newRunEnv(t, runSub("billing", "orders", extra))
	e.put("orders", nil, "a")
	first := e.start(map[string]handler.Handler{"billing": newRecorder(func(context.Context, *handler.Delivery) handler.Outcome {
		return retryAfter(time.Second)
	})})
	waitFor(t, "the copy delayed", func() bool { return first.metric("billing", "scheduled") == 1 })
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestCopiesDueAtStartCounted: the delayed copies due when the daemon
// starts, which the retry queue writes while the handlers are still being
// built (a nats handler whose server does not answer), are counted under
// the subscription that made them.
func TestCopiesDueAtStartCounted(t *testing.T) {
	silent := natstest.StartSilent(t)
	e := spooledCopy(t, "")
	e.config += fmt.Sprintf("\n[[subscription]]\nname = \"n\"\nstream = \"orders\"\nkey = \"other\"\n"+
		"[subscription.handler]\nkind = \"nats\"\nurl = %q\nsubject = \"orders.eu\"\ntimeout = \"1m\"\n", silent.URL())
	r := e.start(map[string]handler.Handler{"billing": newRecorder(nil)})
	waitFor(t, "the due copy written", func() bool {
		recs, err := readRecords(e.stream, "orders")
		return err == nil && len(recs) == 2
	})
	if len(r.logs.with("streamd running")) != 0 {
		t.Fatal("the handlers were built before the copy was written: the test shows nothing")
	}
	if sm := r.d.metrics.Lookup("billing"); sm == nil || testutil.ToFloat64(sm.RetriesAppended) != 1 {
		t.Errorf("the copy written at the start is not counted under billing (handle %v)", sm)
	}
}

// TestCopiesOfFormerNameCounted: a delayed copy made under a name the
// subscription had before (renamed_from), written at the next start, is
// counted under the subscription's name now, as its other copies are.
func TestCopiesOfFormerNameCounted(t *testing.T) {
	e := spooledCopy(t, "")
	e.config = runSub("invoicing", "orders", `renamed_from = ["billing"]`)
	r := e.start(map[string]handler.Handler{"invoicing": newRecorder(nil)})
	waitFor(t, "the due copy counted", func() bool { return r.metric("invoicing", "appended") == 1 })
}

// TestStrandedCopiesAtStart: a start warns of the delayed copies in the
// spool that no subscription of its configuration will handle: those that
// carry the name of a subscription it no longer has, and those made under
// a key the subscription no longer reads; not of those its subscriptions
// handle, also under a former name, nor of those under out_retry, which
// carry no name and are for whoever reads that key.
func TestStrandedCopiesAtStart(t *testing.T) {
	const outRetry = `out_retry = "orders.retry"`
	for _, tc := range []struct {
		name, first, config string
		want                []wantLog
	}{
		{"unchanged", "", runSub("billing", "orders", ""), nil},
		{"renamed", "", runSub("invoicing", "orders", `renamed_from = ["billing"]`), nil},
		{"removed", "", runSub("audit", "orders", ""), []wantLog{{slog.LevelWarn, msgCopiesOfRemoved,
			map[string]string{"made_by": "billing", "stream": "orders", "key": "orders", "copies": "1"}}}},
		{"rekeyed", "", runSub("billing", "invoices", ""), []wantLog{{slog.LevelWarn, msgCopiesOfOldKey,
			map[string]string{"subscription": "billing", "copies_key": "orders", "key": "invoices", "copies": "1"}}}},
		{"out_retry unchanged", outRetry, runSub("billing", "orders", outRetry) + runSub("retrier", "orders.retry", ""), nil},
		{"out_retry maker removed", outRetry, runSub("retrier", "orders.retry", ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := spooledCopy(t, tc.first)
			e.config = tc.config
			r := e.start(nil)
			waitFor(t, "the daemon to run", func() bool { return len(r.logs.with("streamd running")) == 1 })
			got := append(r.logs.with(msgCopiesOfRemoved), r.logs.with(msgCopiesOfOldKey)...)
			checkLogs(t, got, tc.want)
		})
	}
}

// TestStrandedCopiesAtReload: a reload that leaves delayed copies in the
// spool to no subscription warns of them (a subscription removed, a former
// name dropped from renamed_from), unless a subscription takes them over
// by renamed_from; a reload that leaves them as they were, or changes
// their subscription's key (msgKeyChanged says it), does not.
func TestStrandedCopiesAtReload(t *testing.T) {
	billing, renamed := runSub("billing", "orders", ""), runSub("invoicing", "orders", `renamed_from = ["billing"]`)
	for _, tc := range []struct {
		name, first, config string
		want                []wantLog
	}{
		{"removed", billing, runSub("audit", "orders", ""), []wantLog{{slog.LevelWarn, msgCopiesOfRemoved,
			map[string]string{"made_by": "billing", "stream": "orders", "key": "orders", "copies": "1"}}}},
		{"taken over", billing, runSub("audit", "orders", "") + renamed, nil},
		{"former name dropped", renamed, runSub("audit", "orders", "") + runSub("invoicing", "orders", ""), []wantLog{{slog.LevelWarn, msgCopiesOfRemoved,
			map[string]string{"made_by": "billing", "stream": "orders", "key": "orders", "copies": "1"}}}},
		{"another subscription changed", renamed, runSub("audit", "orders", "concurrency = 2") + renamed, nil},
		{"key changed", billing, runSub("audit", "orders", "") + runSub("billing", "invoices", ""), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := spooledCopy(t, "")
			e.config = tc.first + runSub("audit", "orders", "")
			maker := "billing"
			if tc.first == renamed {
				maker = "invoicing"
			}
			hold := newRecorder(func(context.Context, *handler.Delivery) handler.Outcome { return retryAfter(time.Hour) })
			r := e.start(map[string]handler.Handler{maker: hold})
			// The copy comes due, and its subscription delays it again, by
			// an hour.
			waitFor(t, "the copy delayed again", func() bool { return r.metric(maker, "scheduled") == 1 })
			if l := r.logs.with(msgCopiesOfRemoved); len(l) != 0 {
				t.Fatalf("warned at start of copies its subscription handles:\n%s", logLines(l))
			}
			e.config = tc.config
			cfg := e.load()
			if err := r.d.Reload(t.Context(), func() (*conf.Config, error) { return cfg, nil }); err != nil {
				t.Fatal(err)
			}
			checkLogs(t, append(r.logs.with(msgCopiesOfRemoved), r.logs.with(msgCopiesOfOldKey)...), tc.want)
		})
	}
}
