package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
	"github.com/streamd/streamd/tail"
)

// TestReloadResultPrint: an answer that applied the new configuration is
// said on stdout, a refusal with the daemon's reason on stderr.
func TestReloadResultPrint(t *testing.T) {
	for _, tc := range []struct {
		name        string
		result      ReloadResult
		runs        bool
		out, errOut string
	}{
		{name: "applied", result: ReloadResult{PID: 42}, runs: true,
			out: "streamd reload: streamd (pid 42) runs the new configuration\n"},
		{name: "refused", result: ReloadResult{PID: 42, Error: "commit_interval changed from 100ms to 200ms: restart required"},
			errOut: "streamd reload: streamd (pid 42) refused the new configuration; the previous one keeps running:\ncommit_interval changed from 100ms to 200ms: restart required\n"},
		{name: "stopping", result: ReloadResult{PID: 42, Error: errStoppedDuringReload.Error(), Stopping: true},
			errOut: "streamd reload: streamd (pid 42) is stopping: it was told to stop during the reload, and starts neither configuration again:\n" + errStoppedDuringReload.Error() + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			if runs := tc.result.Print(&out, &errOut); runs != tc.runs {
				t.Errorf("Print reported %v, want %v", runs, tc.runs)
			}
			if out.String() != tc.out || errOut.String() != tc.errOut {
				t.Errorf("stdout %q, stderr %q; want %q, %q", out.String(), errOut.String(), tc.out, tc.errOut)
			}
		})
	}
}

// TestPendingCopyOfRenamedStream: a delayed copy whose stream a reload
// renamed stays in the spool, and the failed writes say how to let it be
// written: give the stream its old name back; a reload that does so lets
// the copy be written and delivered.
func TestPendingCopyOfRenamedStream(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("s", "orders", `start_at = "end"`)) // a renamed stream's subscription starts over at its end
	h := newRecorder(retryFirstAttempt(retryAfter(300 * time.Millisecond)))
	r := e.start(map[string]handler.Handler{"s": h})
	waitFor(t, "the daemon to run", func() bool { return len(r.logs.with("streamd running")) == 1 })
	e.put("orders", nil, "a")
	h.waitN(t, 1)

	renamed := e.load()
	renamed.Streams[0].Name, renamed.Subscriptions[0].Stream = "renamed", "renamed"
	if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return renamed, nil }); err != nil {
		t.Fatalf("reload renaming the stream: %v", err)
	}
	waitFor(t, "a failed write of the copy", func() bool { return len(r.logs.with("fire failed, will retry")) > 0 })
	err := r.logs.with("fire failed, will retry")[0].attrs["err"]
	if !strings.Contains(err, `stream "orders" of a pending copy is not configured`) || !strings.Contains(err, "give the stream its old name back") {
		t.Errorf("the failed write says %q; want it to name the stream and the way out", err)
	}
	if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
		t.Fatalf("reload giving the stream its name back: %v", err)
	}
	got := h.waitN(t, 2)
	if got[1].Attempt != 2 || string(got[1].Payload) != "a" {
		t.Errorf("second delivery: attempt %d of %q; want the copy of a, attempt 2", got[1].Attempt, got[1].Payload)
	}
}

// TestOverwrite: an answer written in place of a longer one is padded to
// its size, and reads as the new answer.
func TestOverwrite(t *testing.T) {
	dir := t.TempDir()
	long := ReloadResult{PID: 1, Error: strings.Repeat("x", 200)}
	short := ReloadResult{PID: 2, Config: "/etc/streamd/streamd.toml"}
	b, _ := json.Marshal(long)
	path := filepath.Join(dir, ReloadName)
	if err := os.WriteFile(path, append(b, '\n'), 0o640); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(short)
	if err := overwrite(path, append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	got, err := ReadReloadResult(dir)
	if fi, _ := os.Stat(path); err != nil || !reflect.DeepEqual(got, short) || fi.Size() < 200 {
		t.Errorf("read %+v, %v from %d bytes; want %+v, the file as long as before", got, err, fi.Size(), short)
	}
}

// TestAnswerTo: a client finds the answer naming its request, the latest
// or an earlier one, and no other answer of a daemon that takes requests;
// from a streamd that takes none (no requests in its answers), the first
// answer that started after its signal, as before requests were taken.
func TestAnswerTo(t *testing.T) {
	sent := time.Now()
	before, after := sent.Add(-time.Second), sent.Add(time.Millisecond)
	mine := ReloadResult{PID: 7, Started: after, Requests: []string{"other", "mine"}}
	for _, tc := range []struct {
		name   string
		file   ReloadResult
		want   ReloadResult
		answer bool
	}{
		{name: "latest", file: mine, want: mine, answer: true},
		{name: "earlier", file: ReloadResult{PID: 7, Started: after, Error: "bogus_key", Requests: []string{"next"}, Earlier: []ReloadResult{mine}}, want: mine, answer: true},
		{name: "not yet", file: ReloadResult{PID: 7, Started: after, Error: "bogus_key", Requests: []string{}}},
		{name: "another daemon", file: ReloadResult{PID: 8, Started: after, Requests: []string{"mine"}}},
		{name: "older streamd", file: ReloadResult{PID: 7, Started: after, Error: "bogus_key"}, want: ReloadResult{PID: 7, Started: after, Error: "bogus_key"}, answer: true},
		{name: "older streamd, before the signal", file: ReloadResult{PID: 7, Started: before}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.file.answerTo(7, "mine", sent)
			if ok != tc.answer || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("answerTo = %+v, %v; want %+v, %v", got, ok, tc.want, tc.answer)
			}
		})
	}
}

// inFlightForReload starts a daemon (shutdown_timeout 2s) whose
// subscription s has a delivery in flight until the handlers' context
// ends, and returns it with a configuration that changes s, which a reload
// stops and starts again, and the count of deliveries.
func inFlightForReload(t *testing.T) (*runEnv, *runningDaemon, *conf.Config, *atomic.Int32) {
	e := newRunEnv(t, runSub("s", "orders", ""))
	e.shutdownTimeout = "2s"
	calls := new(atomic.Int32)
	h := handler.HandlerFunc(func(ctx context.Context, _ *handler.Delivery) handler.Outcome {
		calls.Add(1)
		<-ctx.Done() // in flight until the handlers' context ends
		return handler.Failed(handler.FailureCanceled, ctx.Err())
	})
	r := e.start(map[string]handler.Handler{"s": h})
	e.put("orders", nil, "a")
	waitFor(t, "the delivery in flight", func() bool { return calls.Load() == 1 })
	changed := e.load()
	changed.Subscriptions[0].Concurrency = 2
	return e, r, changed, calls
}

// TestStopDuringReload: told to stop while a reload waits for the delivery
// in flight of a subscription it changed, the daemon starts nothing of the
// new configuration (the subscription delivers nothing more), stops within
// shutdown_timeout of being told, and the reload answers that the new
// configuration was not started.
func TestStopDuringReload(t *testing.T) {
	t.Parallel()
	e, r, changed, calls := inFlightForReload(t)
	loaded := make(chan struct{})
	reloaded := make(chan error, 1)
	go func() {
		reloaded <- r.d.Reload(context.Background(), func() (*conf.Config, error) { close(loaded); return changed, nil })
	}()
	<-loaded
	told := time.Now()
	r.cancel()
	if err := r.wait(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if took, most := time.Since(told), 2*time.Second+stopGrace+time.Second; took > most {
		t.Errorf("the stop took %s after the daemon was told, more than shutdown_timeout and its grace (%s)", took, most)
	}
	if err := <-reloaded; !errors.Is(err, errStoppedDuringReload) {
		t.Errorf("Reload: %v, want it to say that the new configuration was not started", err)
	}
	if r, err := ReadReloadResult(filepath.Join(e.dir, "state")); err != nil || !r.Stopping {
		t.Errorf("the answer for streamd reload: %+v, %v; want it to say the daemon stops", r, err)
	}
	if l := r.logs.with("the reload starts the subscription again: its configuration changed"); len(l) != 0 {
		t.Errorf("the log says the reload starts the subscription again, which it does not: %v", l)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d deliveries, want the one in flight alone: the subscription the reload stopped was started again", n)
	}
}

// TestReloadWaitSaid: a reload that waits for a delivery in flight of a
// subscription it starts again says so after a moment (its answer waits
// too), and, at shutdown_timeout, that it cancels the delivery: not the
// stop's words.
func TestReloadWaitSaid(t *testing.T) {
	t.Parallel()
	_, r, changed, calls := inFlightForReload(t)
	if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return changed, nil }); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	const waits = "the reload waits for the deliveries in flight of the subscriptions it stops, at most shutdown_timeout; it answers once they end"
	checkLogs(t, r.logs.with(waits), []wantLog{{slog.LevelInfo, waits, map[string]string{"subscriptions_waited_for": "1", "shutdown_timeout": "2s"}}})
	const cancels = "the reload waited shutdown_timeout for the deliveries in flight of a subscription it stops: cancelling them (an exec handler's command is killed); unsettled, they are delivered again when the subscription next runs (at once, when the reload starts it again)"
	checkLogs(t, r.logs.with(cancels), []wantLog{{slog.LevelWarn, cancels, map[string]string{"subscription": "s", "records": "1"}}})
	if l := r.logs.with("shutdown_timeout passed with records not settled"); len(l) != 0 {
		t.Errorf("the reload logs the stop's line: %v", l)
	}
	waitFor(t, "the delivery again, by the subscription the reload started", func() bool { return calls.Load() == 2 })
	r.cancel()
	if err := r.wait(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestReloadLogsChanges: a reload says what it does to each subscription
// (adds, removes, starts again, and why), and each subscription it starts
// says where it starts.
func TestReloadLogsChanges(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("kept", "orders", "")+runSub("changed", "orders", "")+runSub("removed", "orders", "")+runSub("rekeyed", "orders", ""))
	e.put("orders", nil, "a")
	hs := map[string]handler.Handler{}
	for _, name := range []string{"kept", "changed", "removed", "added", "rekeyed"} {
		hs[name] = newRecorder(nil)
	}
	r := e.start(hs)
	waitFor(t, "the first record settled", func() bool { return r.metric("kept", "ack") == 1 && r.metric("changed", "ack") == 1 })
	e.config = runSub("kept", "orders", "") + runSub("changed", "orders", "concurrency = 2") + runSub("added", "orders", `start_at = "end"`) +
		runSub("rekeyed", "invoices", "")
	if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
		t.Fatal(err)
	}
	said := map[string][]string{}
	for _, l := range r.logs.all() {
		if strings.Contains(l.msg, "reload") || strings.HasPrefix(l.msg, "subscription starts") {
			said[l.attrs["subscription"]] = append(said[l.attrs["subscription"]], l.msg)
		}
	}
	want := map[string][]string{
		"kept":    {"subscription starts at start_at: it has no stored position"},
		"changed": {"subscription starts at start_at: it has no stored position", "the reload starts the subscription again: its configuration changed", "subscription starts at its stored position"},
		"removed": {"subscription starts at start_at: it has no stored position", "the reload removes the subscription"},
		"added":   {"the reload adds the subscription", "subscription starts at start_at: it has no stored position"},
		"rekeyed": {"subscription starts at start_at: it has no stored position", "the reload starts the subscription again: its configuration changed", msgKeyChanged, "subscription starts at its stored position"},
		"":        {"configuration reloaded"},
	}
	if !reflect.DeepEqual(said, want) {
		t.Errorf("the log says\n%q\nwant\n%q", said, want)
	}
	// What changed is named, without the values, which may be secrets;
	// a key changed is a warning: the copies of the old key are left.
	for _, l := range r.logs.all() {
		switch {
		case l.msg == "the reload starts the subscription again: its configuration changed" && l.attrs["subscription"] == "changed":
			if l.attrs["changed"] != "concurrency" {
				t.Errorf("changed=%q for a change of concurrency alone", l.attrs["changed"])
			}
		case l.msg == msgKeyChanged:
			if l.level != slog.LevelWarn || l.attrs["from"] != "orders" || l.attrs["to"] != "invoices" {
				t.Errorf("%v %q from=%q to=%q, want WARN from orders to invoices", l.level, l.msg, l.attrs["from"], l.attrs["to"])
			}
		}
	}
}

// TestReloadRefusesStreamChange: a reload that changes an open stream is
// refused, naming what changed; the previous configuration keeps running.
func TestReloadRefusesStreamChange(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("s", "orders", ""))
	r := e.start(map[string]handler.Handler{"s": newRecorder(nil)})
	e.put("orders", nil, "a")
	waitFor(t, "the record settled", func() bool { return r.metric("s", "ack") == 1 })
	changed := e.load()
	changed.Streams[0].PollInterval = conf.Duration(time.Second)
	changed.Streams[0].Create = false
	err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return changed, nil })
	if want := `stream "orders" changed (create from true to false, poll_interval from 50ms to 1s): restart required`; err == nil || err.Error() != want {
		t.Errorf("Reload: %v, want %q", err, want)
	}
	// The state directory spelled another way, through a symlink, is the
	// same; another one is not, and every change a reload cannot apply is
	// said at once.
	same, other := filepath.Join(e.dir, "link"), filepath.Join(e.dir, "other")
	if err := os.Symlink(changed.StateDir, same); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(other, 0o750); err != nil {
		t.Fatal(err)
	}
	spelled := e.load()
	spelled.StateDir = same + "/"
	if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return spelled, nil }); err != nil {
		t.Errorf("Reload with the state directory spelled through a symlink: %v", err)
	}
	changed.StateDir = other
	changed.CommitInterval = conf.Duration(time.Minute)
	changed.Log.Format = "json"
	err = r.d.Reload(context.Background(), func() (*conf.Config, error) { return changed, nil })
	if want := fmt.Sprintf(`state_dir changed from %q to %q; commit_interval changed from 50ms to 1m0s; log format changed from "auto" to "json"; stream "orders" changed (create from true to false, poll_interval from 50ms to 1s): restart required`, spelled.StateDir, other); err == nil || err.Error() != want {
		t.Errorf("Reload: %v, want %q", err, want)
	}
	// The symlink retargeted: the same spelling names another directory
	// than the one in use, and so does the directory it names now.
	if err := os.Remove(same); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, same); err != nil {
		t.Fatal(err)
	}
	err = r.d.Reload(context.Background(), func() (*conf.Config, error) { return spelled, nil })
	if want := fmt.Sprintf(`state_dir %q names another directory than the one streamd opened at its start (a symlink retargeted since): restart required`, spelled.StateDir); err == nil || err.Error() != want {
		t.Errorf("Reload after the symlink was retargeted: %v, want %q", err, want)
	}
	retargeted := e.load()
	retargeted.StateDir = other
	err = r.d.Reload(context.Background(), func() (*conf.Config, error) { return retargeted, nil })
	if want := fmt.Sprintf(`state_dir changed from %q to %q: restart required`, spelled.StateDir, other); err == nil || err.Error() != want {
		t.Errorf("Reload: %v, want %q", err, want)
	}
}

// holdingRun is a daemon whose subscription s (concurrency 2, a backoff
// of an hour) holds the record "BAD", its handler failing it until fixed,
// keeps "SLOW" in flight until the handlers' context ends or it is fixed,
// and acks every other record.
type holdingRun struct {
	e     *runEnv
	r     *runningDaemon
	h     *recorder
	fixed atomic.Bool
}

func startHolding(e *runEnv) *holdingRun {
	hr := &holdingRun{e: e}
	hr.h = newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
		switch {
		case hr.fixed.Load():
		case string(d.Payload) == "BAD":
			return handler.Failed(handler.FailureTempFail, errors.New("down for this one"))
		case string(d.Payload) == "SLOW":
			<-ctx.Done()
			return handler.Failed(handler.FailureCanceled, ctx.Err())
		}
		return handler.Outcome{Kind: handler.OutcomeAck}
	})
	hr.r = e.start(map[string]handler.Handler{"s": hr.h})
	return hr
}

// waitHeld waits until "BAD" failed a delivery and the acked records
// after it were acked.
func (hr *holdingRun) waitHeld(t *testing.T, acked int) {
	waitFor(t, "the held record, and the records after it settled", func() bool {
		return hr.r.metric("s", "failed") >= 1 && hr.r.metric("s", "ack") == float64(acked)
	})
}

// holdingAhead starts a daemon whose subscription s (reading "orders",
// concurrency 2) acked "a0", holds "BAD", and settled the three records
// after it, passing over one of "other" and a retry copy made under the
// name "old".
func holdingAhead(t *testing.T) *holdingRun {
	e := newRunEnv(t, runSub("s", "orders", "concurrency = 2\nbackoff = [\"1h\"]"))
	e.put("orders", nil, "a0", "BAD")
	e.put("other", nil, "x1")
	e.put("orders", envelope.Headers{{Name: OriginHeader, Value: []byte("old")}, {Name: envelope.RetryCountHeader, Value: []byte("1")}}, "F")
	e.put("orders", nil, "a1", "a2", "a3")
	hr := startHolding(e)
	hr.waitHeld(t, 4)
	return hr
}

// settledRun is a subscription started again after it held "BAD" and
// settled the records after it (holdingAhead): the key and other
// configuration it has then, how a position was set before (to its stored
// offset: "offsets set", or "no settled.json" by a streamd that does not
// know the file, which keeps it), and the deliveries by payload in all.
type settledRun struct {
	name, key, extra string
	positionSet      string
	want             map[string]int
}

// settledRuns are the cases of a reload or a stop and start.
var settledRuns = []settledRun{
	{name: "same records", key: "orders", want: map[string]int{"a0": 1, "BAD": 2, "a1": 1, "a2": 1, "a3": 1}},
	// A record passed over may be wanted now: nothing is handed over.
	{name: "key changed", key: "other", want: map[string]int{"a0": 1, "BAD": 1, "a1": 1, "a2": 1, "a3": 1, "x1": 1}},
	{name: "renamed_from added", key: "orders", extra: `renamed_from = ["old"]`, want: map[string]int{"a0": 1, "BAD": 2, "F": 1, "a1": 2, "a2": 2, "a3": 2}},
}

// again mends the handler and returns the configuration of s started
// again as run says, with a short backoff.
func (hr *holdingRun) again(run settledRun) string {
	hr.fixed.Store(true)
	return runSub("s", run.key, "concurrency = 2\nbackoff = [\"20ms\"]\n"+run.extra)
}

// startMended starts the daemon again, with the handler mended and s
// configured as run says, and returns the deliveries by payload in all
// (settle).
func (hr *holdingRun) startMended(t *testing.T, run settledRun) map[string]int {
	hr.e.config = hr.again(run)
	return hr.settle(t, hr.e.start(map[string]handler.Handler{"s": hr.h}))
}

// settle waits until every record of the file settled, stops the daemon r
// and returns the deliveries by payload.
func (hr *holdingRun) settle(t *testing.T, r *runningDaemon) map[string]int {
	size := hr.e.fileSize()
	waitFor(t, "every record settled", func() bool { return hr.e.storedOffset("s") == size })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	return hr.delivered()
}

// delivered returns the deliveries so far by payload.
func (hr *holdingRun) delivered() map[string]int {
	got := map[string]int{}
	for _, d := range hr.h.deliveries() {
		got[string(d.Payload)]++
	}
	return got
}

// TestReloadHandsOverSettled: a reload that starts again a subscription
// holding a record (its handler down for that one) while it settled the
// records after it (concurrency 2) delivers the held record again, and
// not those: they settled before the reload. A reload that changes the
// key or renamed_from hands nothing over.
func TestReloadHandsOverSettled(t *testing.T) {
	t.Parallel()
	for _, tc := range settledRuns {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hr := holdingAhead(t)
			hr.e.config = hr.again(tc)
			if err := hr.r.d.Reload(context.Background(), func() (*conf.Config, error) { return hr.e.load(), nil }); err != nil {
				t.Fatal(err)
			}
			if got := hr.settle(t, hr.r); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("deliveries by payload %v, want %v", got, tc.want)
			}
		})
	}
}

// TestReloadDeliversHeldNow: a reload that keeps a subscription holding a
// record (the backoff step an hour) delivers the record again at once:
// the operator mended the handler.
func TestReloadDeliversHeldNow(t *testing.T) {
	t.Parallel()
	hr := holdingAhead(t)
	hr.fixed.Store(true)
	if err := hr.r.d.Reload(context.Background(), func() (*conf.Config, error) { return hr.e.load(), nil }); err != nil {
		t.Fatal(err)
	}
	if l := hr.r.logs.with("the reload starts the subscription again: its configuration changed"); len(l) != 0 {
		t.Fatalf("the subscription was started again: %v", l)
	}
	want := map[string]int{"a0": 1, "BAD": 2, "a1": 1, "a2": 1, "a3": 1}
	if got := hr.settle(t, hr.r); !reflect.DeepEqual(got, want) {
		t.Errorf("deliveries by payload %v, want %v", got, want)
	}
}

// TestStopKeepsSettled: a stop while a subscription holds a record keeps
// the records it settled after it for the next start, which delivers the
// held record again and not those, unless it changed key or renamed_from;
// or a position was set by hand before it, to the same position: every
// record from there is delivered; also when the kept file outlived it
// (set by a streamd that does not know the file: the position is another
// commit).
func TestStopKeepsSettled(t *testing.T) {
	t.Parallel()
	again := map[string]int{"a0": 1, "BAD": 2, "a1": 2, "a2": 2, "a3": 2}
	cases := append(slices.Clone(settledRuns),
		settledRun{name: "position set", key: "orders", positionSet: "offsets set", want: again},
		settledRun{name: "position set by an older streamd", key: "orders", positionSet: "no settled.json", want: again})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hr := holdingAhead(t)
			if err := hr.r.stop(); err != nil {
				t.Fatal(err)
			}
			switch tc.positionSet {
			case "offsets set":
				at, err := tail.ParseStart(fmt.Sprintf("offset:%d", hr.e.storedOffset("s")))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := SetPosition(hr.e.load(), "s", at); err != nil {
					t.Fatal(err)
				}
			case "no settled.json":
				store, err := offsets.Open(filepath.Join(hr.e.dir, "state"), offsets.Options{})
				if err != nil {
					t.Fatal(err)
				}
				p, _ := store.Get("s")
				p.LastSeq = 0 // as offsets set stores it
				if err := errors.Join(store.Set("s", p), store.Commit(), store.Close()); err != nil {
					t.Fatal(err)
				}
			}
			if got := hr.startMended(t, tc); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("deliveries by payload %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStopKeepsSettledNotYetRead: a start that has not yet read the
// records the stop before it kept (its reader waits for a worker: both
// are busy with the held record and one in flight) keeps them again at
// its own stop.
func TestStopKeepsSettledNotYetRead(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("s", "orders", "concurrency = 4\nbackoff = [\"1h\"]"))
	e.shutdownTimeout = "300ms"
	e.put("orders", nil, "BAD", "SLOW", "SLOW", "a1", "a2", "a3")
	hr := startHolding(e)
	waitFor(t, "BAD held, both SLOW in flight, a1 to a3 acked", func() bool {
		return hr.r.metric("s", "failed") >= 1 && hr.delivered()["SLOW"] == 2 && hr.r.metric("s", "ack") == 3
	})
	if err := hr.r.stop(); err != nil {
		t.Fatal(err)
	}
	e.config = runSub("s", "orders", "concurrency = 2\nbackoff = [\"1h\"]")
	r := e.start(map[string]handler.Handler{"s": hr.h})
	waitFor(t, "BAD held again, the first SLOW in flight again", func() bool {
		return r.metric("s", "failed") >= 1 && hr.delivered()["SLOW"] == 3
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"BAD": 3, "SLOW": 5, "a1": 1, "a2": 1, "a3": 1}
	if got := hr.startMended(t, settledRuns[0]); !reflect.DeepEqual(got, want) {
		t.Errorf("deliveries by payload %v, want %v", got, want)
	}
}

// TestStopDuringReloadKeepsSettled: a stop that comes while a reload waits
// for the delivery in flight of a subscription it starts again keeps what
// that subscription settled for the next start, as any stop does.
func TestStopDuringReloadKeepsSettled(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("s", "orders", "concurrency = 2\nbackoff = [\"1h\"]"))
	e.shutdownTimeout = "1s"
	e.put("orders", nil, "BAD", "a1", "a2", "a3", "SLOW")
	hr := startHolding(e)
	waitFor(t, "BAD held, a1 to a3 acked, SLOW in flight", func() bool {
		return hr.r.metric("s", "failed") >= 1 && hr.r.metric("s", "ack") == 3 && hr.delivered()["SLOW"] >= 1
	})
	changed := e.load()
	changed.Subscriptions[0].Concurrency = 3 // s is stopped and started again
	loaded := make(chan struct{})
	reloaded := make(chan error, 1)
	go func() {
		reloaded <- hr.r.d.Reload(context.Background(), func() (*conf.Config, error) { close(loaded); return changed, nil })
	}()
	<-loaded
	hr.r.cancel()
	if err := hr.r.wait(); err != nil {
		t.Fatal(err)
	}
	if err := <-reloaded; !errors.Is(err, errStoppedDuringReload) {
		t.Fatalf("Reload: %v, want it stopped", err)
	}
	want := map[string]int{"BAD": 2, "SLOW": 2, "a1": 1, "a2": 1, "a3": 1}
	if got := hr.startMended(t, settledRuns[0]); !reflect.DeepEqual(got, want) {
		t.Errorf("deliveries by payload %v, want %v", got, want)
	}
}

// TestReloadHandOverFileWrittenAgain: a file truncated in place and
// written again under the same header, while a record was held, keeps its
// identity; the records written again at the offsets the old run settled
// are other records, delivered after the reload all the same.
func TestReloadHandOverFileWrittenAgain(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("s", "orders", "concurrency = 2\nbackoff = [\"1h\"]"))
	e.put("orders", nil, "BAD", "a01", "a02", "a03")
	hr := startHolding(e)
	hr.waitHeld(t, 3)
	if err := os.Truncate(e.stream, streamfile.HeaderSize); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the truncation seen", func() bool {
		return slices.ContainsFunc(hr.r.logs.all(), func(l logRecord) bool { return strings.Contains(l.msg, "truncated") })
	})
	e.put("orders", nil, "b00", "b01", "b02", "b03") // the same sizes
	hr.e.config = hr.again(settledRuns[0])
	if err := hr.r.d.Reload(context.Background(), func() (*conf.Config, error) { return hr.e.load(), nil }); err != nil {
		t.Fatal(err)
	}
	got := hr.settle(t, hr.r)
	for _, p := range []string{"b00", "b01", "b02", "b03"} {
		if got[p] != 1 {
			t.Errorf("%s delivered %d times, want once (deliveries %v)", p, got[p], got)
		}
	}
}

// TestReloadReadsOnRemovedRotatedFile: a reload that starts a subscription
// again while its position is in a file rotated away from the path and
// removed since (logrotate's compress without delaycompress) reads that
// file on from the position, through the descriptor the stopped
// subscription held, then the new file at the path: no record is lost, and
// none is delivered twice.
func TestReloadReadsOnRemovedRotatedFile(t *testing.T) {
	t.Parallel()
	hr := startHoldingM7(t)
	hr.rotateAway()
	hr.e.put("orders", nil, "n1")
	hr.reloadAndCheck("1/1/n1")
	if !slices.ContainsFunc(hr.r.logs.all(), func(l logRecord) bool { return strings.Contains(l.msg, "held open since it was read") }) {
		t.Fatal("no line says the file held open is read on")
	}
}

// TestReloadReadsOnFilesReadAhead: a reload while a subscription's
// position is in a file rotated away and removed, and its reader had gone
// on to the next file, rotated away and removed since too, reads both on:
// the file of the position from it, then the next one from its beginning,
// through the descriptors the stopped subscription held, then the file at
// the path. Nothing is lost, nothing delivered twice but the record in
// flight.
func TestReloadReadsOnFilesReadAhead(t *testing.T) {
	t.Parallel()
	hr := startHoldingM7(t)
	hr.rotateAway()
	hr.e.put("orders", nil, "n1", "n2", "n3")
	read := hr.r.d.metrics.Subscription("billing", "orders").RecordsRead
	waitFor(t, "the next file read ahead", func() bool { return testutil.ToFloat64(read) >= 27 })
	hr.rotateAway()
	hr.e.put("orders", nil, "p1")
	hr.reloadAndCheck("1/1/n1", "2/1/n2", "3/1/n3", "1/1/p1")
}

// heldRotation is a daemon whose subscription billing read m1..m24 of its
// stream file and holds m7 in flight until a reload's stop ends it, with
// rotations left at once once read.
type heldRotation struct {
	t *testing.T
	e *runEnv
	r *runningDaemon
	h *recorder
}

func startHoldingM7(t *testing.T) *heldRotation {
	t.Helper()
	const quick = "rotation_grace = \"0s\"\n"
	e := newRunEnv(t, quick+runSub("billing", "orders", `log_unsupported = "first"`))
	e.shutdownTimeout = "20ms"
	e.put("orders", nil, numbered(24)...)
	inFlight := make(chan struct{})
	var held atomic.Bool
	h := newRecorder(func(ctx context.Context, d *handler.Delivery) handler.Outcome {
		if string(d.Payload) == "m7" && !held.Swap(true) {
			close(inFlight)
			<-ctx.Done() // held until the reload's stop ends it
			return handler.Failed(handler.FailureCanceled, ctx.Err())
		}
		return ack
	})
	r := e.start(map[string]handler.Handler{"billing": h})
	<-inFlight
	e.config = quick + runSub("billing", "orders", `log_unsupported = "every"`) // what the reload changes
	return &heldRotation{t: t, e: e, r: r, h: h}
}

// rotateAway renames the stream file away and removes it (compressed).
func (hr *heldRotation) rotateAway() {
	hr.t.Helper()
	rotated := hr.e.stream + ".1"
	if err := os.Rename(hr.e.stream, rotated); err != nil {
		hr.t.Fatal(err)
	}
	if err := os.Remove(rotated); err != nil {
		hr.t.Fatal(err)
	}
}

// reloadAndCheck reloads, stops, and checks that m1..m24 were delivered in
// order, m7 again after the reload, then the deliveries after.
func (hr *heldRotation) reloadAndCheck(after ...string) {
	t := hr.t
	t.Helper()
	if err := hr.r.d.Reload(t.Context(), func() (*conf.Config, error) { return hr.e.load(), nil }); err != nil {
		t.Fatal(err)
	}
	hr.h.waitN(t, 25+len(after)) // m7 twice
	if err := hr.r.stop(); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 24 {
		want = append(want, fmt.Sprintf("%d/1/m%d", i+1, i+1))
	}
	want = slices.Insert(want, 7, "7/1/m7")
	want = append(want, after...)
	if got := hr.h.seen(); !slices.Equal(got, want) {
		t.Fatalf("deliveries %q, want m1..m24 in order (m7 again after the reload), then %q", got, after)
	}
}

// TestReloadTwiceWhileNoFileAtPath: two reloads while no file is at the
// path (a rotation's rename, before the next file is made) hand the file
// of the position on each time, though the subscription started by the
// first took no record of it: a writer still appending to the renamed
// file has its records delivered, then the next file's.
func TestReloadTwiceWhileNoFileAtPath(t *testing.T) {
	t.Parallel()
	const quick = "rotation_grace = \"0s\"\n"
	e := newRunEnv(t, quick+runSub("billing", "orders", `log_unsupported = "first"`))
	e.put("orders", nil, "m1", "m2", "m3")
	h := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": h})
	h.waitN(t, 3)
	rotated := e.stream + ".1"
	if err := os.Rename(e.stream, rotated); err != nil {
		t.Fatal(err)
	}
	for i, level := range []string{"every", "first"} {
		e.config = quick + runSub("billing", "orders", `log_unsupported = "`+level+`"`)
		if err := r.d.Reload(t.Context(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the held file followed", func() bool {
			return len(r.logs.with("no file is at the path: reading the file of the stored position, held open since it was read, on from the position, and waiting for a file at the path")) == i+1
		})
	}
	stream := e.stream
	e.stream = rotated // a writer that kept it open appends to it
	e.put("orders", nil, "m4")
	h.waitN(t, 4)
	if err := os.Remove(rotated); err != nil { // compressed
		t.Fatal(err)
	}
	e.stream = stream
	e.put("orders", nil, "n1")
	h.waitN(t, 5)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := h.seen(), []string{"1/1/m1", "2/1/m2", "3/1/m3", "4/1/m4", "1/1/n1"}; !slices.Equal(got, want) {
		t.Fatalf("deliveries %q, want %q", got, want)
	}
}
