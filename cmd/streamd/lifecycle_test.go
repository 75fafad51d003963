package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/daemon"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/offsets"
)

// The lifecycle tests drive the daemon with signals (DESIGN.md Invariant
// 7, STYLE.md §9): SIGTERM, SIGHUP, the sd_notify messages and the
// watchdog.

// editConfig rewrites the env's config file, replacing each old string
// with its new one (pairs); each must be present.
func (e *env) editConfig(pairs ...string) {
	e.t.Helper()
	b, err := os.ReadFile(e.config)
	if err != nil {
		e.t.Fatal(err)
	}
	s := string(b)
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			e.t.Fatalf("config has no %q:\n%s", pairs[i], s)
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	if err := os.WriteFile(e.config, []byte(s), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// logCount is how often msg occurs in the daemon's log.
func (p *daemonProc) logCount(msg string) int { return strings.Count(p.stderr.String(), msg) }

// lifecycleSub is an exec subscription on key that logs "name seq attempt
// payload start|end" around the given shell snippet.
func lifecycleSub(name, key, extra, script string) string {
	return execSubTable(name, key, extra, `
IFS= read -r p
echo "$STREAMD_SUBSCRIPTION $STREAMD_SEQ $STREAMD_ATTEMPT $p start" >> LOG
`+script+`
echo "$STREAMD_SUBSCRIPTION $STREAMD_SEQ $STREAMD_ATTEMPT $p end" >> LOG
`)
}

// ended returns the "name seq attempt payload" of the deliveries that
// finished, in log order.
func (e *env) ended() []string {
	var out []string
	for _, l := range e.deliveries() {
		if s, ok := strings.CutSuffix(l, " end"); ok {
			out = append(out, s)
		}
	}
	return out
}

// endedCount counts the finished deliveries whose "name seq attempt
// payload" ends with suffix.
func (e *env) endedCount(suffix string) int {
	n := 0
	for _, l := range e.ended() {
		if strings.HasSuffix(l, suffix) {
			n++
		}
	}
	return n
}

// TestSIGTERMGraceful stops the daemon with SIGTERM while two handlers run
// (1 s each) and two delayed copies wait in the spool, one due in 2 s and
// one in an hour (Invariant 7): it exits 0 within shutdown_timeout after
// letting the handlers finish, having read nothing more and committed the
// positions; the copies stay in the spool. A restart after 2 s appends the
// due copy exactly once, as settlement.md §4.2 says it must look, delivers
// the records the stop left unread, and repeats none that were settled.
func TestSIGTERMGraceful(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lifecycleSub("billing", "orders", "concurrency = 2", `case $p in
later-*) [ "$STREAMD_ATTEMPT" = 1 ] && echo retry_after=2s ;;
hour-*) [ "$STREAMD_ATTEMPT" = 1 ] && echo retry_after=1h ;;
slow-*) sleep 1 ;;
esac`))
	e.publish("later-1", "hour-1", "slow-1", "slow-2", "slow-3", "slow-4")
	const shutdownTimeout = 5 * time.Second // writeConfig's

	p := e.start()
	// Two workers: both slow records started means both quick ones were
	// handled and settled (their copies spooled) first.
	eventually(t, 20*time.Second, "slow-1 and slow-2 to start", func() bool {
		lines := strings.Join(e.deliveries(), "\n")
		return strings.Contains(lines, " slow-1 start") && strings.Contains(lines, " slow-2 start")
	})
	sigterm := time.Now() // after later-1's copy was spooled, due 2s later
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(shutdownTimeout + 2*time.Second):
		t.Fatalf("no exit within shutdown_timeout (%s) after SIGTERM", shutdownTimeout)
	}
	took := time.Since(sigterm)
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if took > shutdownTimeout {
		t.Errorf("stop took %s, more than shutdown_timeout %s", took, shutdownTimeout)
	}
	got := e.ended()
	want := []string{"billing 1 1 later-1", "billing 2 1 hour-1", "billing 3 1 slow-1", "billing 4 1 slow-2"}
	if joinSorted(got) != strings.Join(want, "|") {
		t.Fatalf("finished deliveries before the stop %q, want %q (the handlers in flight finish, nothing more is read)", got, want)
	}
	if n := len(e.deliveries()); n != 8 {
		t.Errorf("%d delivery log lines, want 8: no delivery may start after SIGTERM\n%s", n, strings.Join(e.deliveries(), "\n"))
	}
	t.Logf("stopped %s after SIGTERM with 2 handlers in flight", took.Round(time.Millisecond))

	// Positions committed: the end of slow-2, the last record settled.
	recs := scanFrames(e.stream)
	pos := storedPosition(t, e, "billing")
	if pos.LastSeq != 4 || pos.Offset != recs[3].End {
		t.Errorf("stored position %+v, want last_seq 4 at offset %d", pos, recs[3].End)
	}
	// The delayed copies are in the spool, not in the file.
	if n := len(e.framesOf("orders")); n != 6 {
		t.Errorf("%d records under orders after the stop, want the 6 published", n)
	}
	if fi, err := os.Stat(filepath.Join(e.stateDirPath(), "retry.spool")); err != nil {
		t.Errorf("retry.spool after the stop: %v", err)
	} else if fi.Size() <= int64(len("SDRETRY1")) {
		t.Errorf("retry.spool after the stop has %d bytes: no pending copy", fi.Size())
	}
	if n := spoolPending(t, e.stateDirPath()); n != 2 {
		t.Errorf("%d copies pending in the spool, want 2", n)
	}

	// Restart once later-1's copy is due.
	time.Sleep(time.Until(sigterm.Add(2200 * time.Millisecond)))
	before := len(e.deliveries())
	p = e.start()
	eventually(t, 20*time.Second, "slow-3, slow-4 and the copy of later-1", func() bool {
		return e.endedCount(" slow-3") == 1 && e.endedCount(" slow-4") == 1 && e.endedCount(" 2 later-1") == 1
	})
	eventually(t, 10*time.Second, "the copy's position to be committed", committedThrough(e.stateDirPath(), "billing", 7))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	var again []string
	for _, l := range e.deliveries()[before:] {
		if s, ok := strings.CutSuffix(l, " end"); ok {
			again = append(again, s)
		}
	}
	want = []string{"billing 5 1 slow-3", "billing 6 1 slow-4", "billing 7 2 later-1"}
	if joinSorted(again) != strings.Join(want, "|") {
		t.Errorf("deliveries after the restart %q, want %q: no acknowledged record again", again, want)
	}
	orders := e.framesOf("orders")
	if len(orders) != 7 {
		t.Fatalf("%d records under orders after the restart, want 6 and one copy", len(orders))
	}
	c := orders[6]
	if c.seq != 7 || c.payload != "later-1" || c.header(envelope.RetryCountHeader) != "1" ||
		c.header(envelope.SequenceHeader) != "1" || c.header("x-streamd-origin") != "billing" || len(c.headers) != 3 {
		t.Errorf("the copy: seq %d payload %q headers %v; want seq 7, later-1, retry count 1, stream-sequence 1, origin billing", c.seq, c.payload, c.headers)
	}
	if n := spoolPending(t, e.stateDirPath()); n != 1 {
		t.Errorf("%d copies pending in the spool after the restart, want 1 (hour-1, due in an hour)", n)
	}
	if pos, end := storedPosition(t, e, "billing"), scanFrames(e.stream)[6].End; pos.LastSeq != 7 || pos.Offset != end {
		t.Errorf("stored position %+v after the second stop, want last_seq 7 at the end of the file", pos)
	}
}

// joinSorted joins a sorted copy of s with "|", for comparing sets of
// log lines.
func joinSorted(s []string) string { return strings.Join(slices.Sorted(slices.Values(s)), "|") }

// storedPosition loads the sidecar and returns the subscription's position.
func storedPosition(t *testing.T, e *env, name string) offsets.Position {
	t.Helper()
	positions, err := offsets.Load(e.stateDirPath())
	if err != nil {
		t.Fatal(err)
	}
	pos, ok := positions[name]
	if !ok {
		t.Fatalf("no position stored for %s: %+v", name, positions)
	}
	return pos
}

// metricValue fetches /metrics from addr and returns the value of the
// sample whose line starts with series (a name, with labels if any).
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	v, ok := scrapeGauge(addr, series)
	if !ok {
		t.Fatalf("GET /metrics from %s: no readable %s", addr, series)
	}
	return v
}

const reloadGauge = "streamd_config_last_reload_successful"

// TestSIGHUPReload reloads the configuration with SIGHUP: a valid change
// (a second subscription, on another key) starts it while the first runs
// on without redelivering anything; an invalid file and a change that needs
// a restart each leave the running configuration as it was, say why in the
// log, and set streamd_config_last_reload_successful to 0; a valid reload
// sets it back to 1.
func TestSIGHUPReload(t *testing.T) {
	t.Parallel()
	addr := freePort(t)
	billing := lifecycleSub("billing", "orders", "", "")
	audit := lifecycleSub("audit", "audit", "", "")
	e := newEnv(t, billing)
	e.editConfig(`listen = ""`, fmt.Sprintf("listen = %q", addr))
	withAudit := func(extra ...string) {
		e.writeConfig(billing + audit)
		e.editConfig(append([]string{`listen = ""`, fmt.Sprintf("listen = %q", addr)}, extra...)...)
	}
	e.publish("o1", "o2")
	p := e.start()
	eventually(t, 20*time.Second, "o1 and o2", func() bool { return len(e.ended()) == 2 })
	eventually(t, 5*time.Second, "/metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	if g := metricValue(t, addr, reloadGauge); g != 1 {
		t.Fatalf("%s = %v after the start, want 1", reloadGauge, g)
	}
	hup := func(msg string, want int) {
		t.Helper()
		p.cmd.Process.Signal(syscall.SIGHUP)
		eventually(t, 10*time.Second, fmt.Sprintf("log %q", msg), func() bool { return p.logCount(msg) >= want })
	}

	t.Run("valid change", func(t *testing.T) {
		withAudit()
		hup("configuration reloaded", 1)
		runBinaryOK(t, "a1", "publish", "--file="+e.stream, "--key=audit")
		e.publish("o3")
		eventually(t, 20*time.Second, "a1 and o3", func() bool {
			return e.endedCount("audit 1 1 a1") == 1 && e.endedCount(" 1 o3") == 1
		})
		if g := metricValue(t, addr, reloadGauge); g != 1 {
			t.Errorf("%s = %v after a valid reload, want 1", reloadGauge, g)
		}
	})

	t.Run("invalid file", func(t *testing.T) {
		withAudit(`name = "audit"`, "name = \"audit\"\nconcurrency = \"eight\"")
		hup("reload failed; the previous configuration keeps running", 1)
		if log := p.stderr.String(); !strings.Contains(log, "concurrency") {
			t.Errorf("the log does not say what is wrong (concurrency):\n%s", log)
		}
		runBinaryOK(t, "a2", "publish", "--file="+e.stream, "--key=audit")
		e.publish("o4")
		eventually(t, 20*time.Second, "a2 and o4 under the old configuration", func() bool {
			return e.endedCount("audit 2 1 a2") == 1 && e.endedCount(" 1 o4") == 1
		})
		if g := metricValue(t, addr, reloadGauge); g != 0 {
			t.Errorf("%s = %v after a reload whose file failed to load, want 0 (metrics/doc.go: "+
				"\"1 if the last configuration load or reload succeeded, else 0\")", reloadGauge, g)
		}
	})

	t.Run("restart required", func(t *testing.T) {
		withAudit(`commit_interval = "100ms"`, `commit_interval = "200ms"`)
		hup("reload failed; the previous configuration keeps running", 2)
		if log := p.stderr.String(); !strings.Contains(log, "commit_interval changed") || !strings.Contains(log, "restart required") {
			t.Errorf("the log does not say why:\n%s", log)
		}
		e.publish("o5")
		eventually(t, 20*time.Second, "o5 under the old configuration", func() bool { return e.endedCount(" 1 o5") == 1 })
		if g := metricValue(t, addr, reloadGauge); g != 0 {
			t.Errorf("%s = %v after a failed reload, want 0", reloadGauge, g)
		}
	})

	t.Run("handler that cannot be built", func(t *testing.T) {
		// billing's handler changes to a program that does not exist: it
		// is refused before anything stops, and billing runs on.
		withAudit(`"/bin/sh"`, `"/nonexistent/sh"`)
		hup("reload failed; the previous configuration keeps running", 3)
		if log := p.stderr.String(); !strings.Contains(log, `subscription \"billing\": exec handler: command:`) {
			t.Errorf("the log does not say why:\n%s", log)
		}
		e.publish("o6")
		eventually(t, 20*time.Second, "o6 under the old configuration", func() bool { return e.endedCount(" 1 o6") == 1 })
	})

	t.Run("valid again", func(t *testing.T) {
		withAudit()
		hup("configuration reloaded", 2)
		if g := metricValue(t, addr, reloadGauge); g != 1 {
			t.Errorf("%s = %v after a valid reload, want 1", reloadGauge, g)
		}
	})

	e.publish("o7")
	eventually(t, 20*time.Second, "o7", func() bool { return e.endedCount(" 1 o7") == 1 })
	eventually(t, 10*time.Second, "o7's position to be committed", committedThrough(e.stateDirPath(), "billing", 7))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	// Every record once: billing was never restarted, so nothing of it
	// was delivered again; audit started at its first reload.
	want := []string{
		"audit 1 1 a1", "audit 2 1 a2",
		"billing 1 1 o1", "billing 2 1 o2", "billing 3 1 o3", "billing 4 1 o4", "billing 5 1 o5", "billing 6 1 o6", "billing 7 1 o7",
	}
	if got := e.ended(); joinSorted(got) != strings.Join(want, "|") {
		t.Errorf("deliveries %q, want %q", got, want)
	}
	if n := p.logCount("configuration reloaded"); n != 2 {
		t.Errorf("%d successful reloads logged, want 2", n)
	}
}

// runBinaryOK runs streamd with one stdin line and fails the test unless
// it exits 0.
func runBinaryOK(t *testing.T, line string, args ...string) {
	t.Helper()
	if r := runBinary(t, []byte(line+"\n"), args...); r.code != 0 {
		t.Fatalf("streamd %s: exit %d: %s", args[0], r.code, r.stderr)
	}
}

// notifySocket is a unixgram socket standing in for systemd's: the
// daemon finds it in $NOTIFY_SOCKET (env).
type notifySocket struct {
	conn *net.UnixConn
	msgs chan notifyMsg
	env  string // NOTIFY_SOCKET=path, for env.startWith
}

type notifyMsg struct {
	at   time.Time
	text string
}

// listenNotify listens on t.TempDir()/notify.sock.
func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	conn, path := testutil.ListenNotify(t)
	n := &notifySocket{conn: conn, msgs: make(chan notifyMsg, 4096), env: "NOTIFY_SOCKET=" + path}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				close(n.msgs)
				return
			}
			n.msgs <- notifyMsg{time.Now(), string(buf[:k])}
		}
	}()
	return n
}

// next returns the next message other than WATCHDOG=1, failing the test
// after timeout.
func (n *notifySocket) next(t *testing.T, timeout time.Duration, what string) notifyMsg {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket closed while waiting for %s", what)
			}
			if m.text != "WATCHDOG=1" {
				return m
			}
		case <-deadline:
			t.Fatalf("no sd_notify message within %s, waiting for %s", timeout, what)
		}
	}
}

// fields parses a notify message into its VAR=value lines.
func (m notifyMsg) fields() map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(m.text, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, as sd_notify's
// MONOTONIC_USEC.
func monotonicUsec(t *testing.T) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Sec*1_000_000 + ts.Nsec/1_000
}

// TestNotifySequence follows the sd_notify messages of a daemon's life
// (STYLE.md §9): READY=1 once it runs; on SIGHUP RELOADING=1 with the
// MONOTONIC_USEC of the reload, then READY=1; on SIGTERM STOPPING=1 with
// EXTEND_TIMEOUT_USEC; in
// that order and nothing else. A reload with an invalid file keeps the old
// configuration and says so in STATUS=, between RELOADING=1 and READY=1.
func TestNotifySequence(t *testing.T) {
	t.Parallel()
	ns := listenNotify(t)
	e := newEnv(t, lifecycleSub("billing", "orders", "", ""))
	e.publish("o1")
	p := e.startWith(nil, ns.env)
	m := ns.next(t, 20*time.Second, "READY=1")
	if f := m.fields(); f["READY"] != "1" || !strings.Contains(f["STATUS"], "1 of 1 subscriptions running") {
		t.Fatalf("first message %q, want READY=1 with a STATUS", m.text)
	}
	eventually(t, 20*time.Second, "o1", func() bool { return len(e.ended()) == 1 })

	before := monotonicUsec(t)
	p.cmd.Process.Signal(syscall.SIGHUP)
	m = ns.next(t, 10*time.Second, "RELOADING=1")
	after := monotonicUsec(t)
	f := m.fields()
	usec, err := strconv.ParseInt(f["MONOTONIC_USEC"], 10, 64)
	if f["RELOADING"] != "1" || err != nil || len(f) != 2 {
		t.Fatalf("message after SIGHUP %q, want RELOADING=1 and MONOTONIC_USEC=", m.text)
	}
	if usec < before || usec > after {
		t.Errorf("MONOTONIC_USEC=%d is not between the SIGHUP (%d) and its receipt (%d)", usec, before, after)
	}
	if m = ns.next(t, 10*time.Second, "READY=1 after the reload"); m.fields()["READY"] != "1" {
		t.Fatalf("message after RELOADING=1 %q, want READY=1", m.text)
	}

	t.Run("invalid file", func(t *testing.T) {
		e.editConfig(`commit_interval = "100ms"`, `commit_interval = 100`)
		defer e.editConfig(`commit_interval = 100`, `commit_interval = "100ms"`)
		p.cmd.Process.Signal(syscall.SIGHUP)
		eventually(t, 10*time.Second, "the reload error in the log", func() bool { return p.logCount("reload failed") == 1 })
		var got []string
		timeout := time.After(time.Second)
	collect:
		for len(got) < 2 {
			select {
			case m := <-ns.msgs:
				got = append(got, m.text)
			case <-timeout:
				break collect
			}
		}
		if len(got) == 2 && strings.HasPrefix(got[0], "RELOADING=1\nMONOTONIC_USEC=") &&
			strings.Contains(got[1], "READY=1") && strings.Contains(got[1], "commit_interval") {
			return
		}
		t.Errorf("a SIGHUP with an invalid file sent %q; STYLE.md §9 wants RELOADING=1, then READY=1 "+
			"with STATUS= carrying the error", got)
	})

	p.cmd.Process.Signal(syscall.SIGTERM)
	// The stop may take shutdown_timeout (5s) and 10s more: systemd is
	// told, so that a shorter TimeoutStopSec does not kill it first.
	if m = ns.next(t, 10*time.Second, "STOPPING=1"); m.text != "STOPPING=1\nEXTEND_TIMEOUT_USEC=15000000" {
		t.Fatalf("message after SIGTERM %q, want STOPPING=1 and EXTEND_TIMEOUT_USEC=15000000", m.text)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit after STOPPING=1")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	select {
	case m, ok := <-ns.msgs:
		if ok {
			t.Errorf("message after STOPPING=1: %q", m.text)
		}
	case <-time.After(100 * time.Millisecond):
	}
}

// pings counts the WATCHDOG=1 messages that arrive in the next d, and
// the longest time without one; messages that arrived before, and other
// messages, are dropped.
func (n *notifySocket) pings(d time.Duration) (count int, longestGap time.Duration) {
	deadline := time.After(d)
	start := time.Now()
	last := start
	for {
		select {
		case m := <-n.msgs:
			if m.text == "WATCHDOG=1" && !m.at.Before(start) {
				count++
				longestGap = max(longestGap, m.at.Sub(last))
				last = m.at
			}
		case <-deadline:
			return count, max(longestGap, time.Since(last))
		}
	}
}

// TestWatchdog runs the daemon with WATCHDOG_USEC=200000 (no WATCHDOG_PID:
// the daemon is the test's child, its pid is not known before it starts).
// It pings every 100 ms while idle and while handlers work within their
// timeout; it stops pinging while a delivery runs for longer than twice the
// longer of shutdown_timeout and the handler's timeout (Daemon.wedged), and
// pings again once that delivery returns.
//
// No exec handler can wedge the pipeline: its timeout kills the process
// group, and the output of a process that left the group is abandoned one
// second later (exec.Cmd.WaitDelay), so a delivery lasts at most its
// timeout plus a second. The stdout handler can: it writes to the daemon's
// stdout without a deadline and ignores its context, so a stdout pipe that
// nobody reads blocks it for good. That is the wedge constructed here.
//
// It does not run in parallel with other tests: it times the pings.
func TestWatchdog(t *testing.T) {
	const watchdog = "WATCHDOG_USEC=200000"
	t.Run("idle and busy", func(t *testing.T) {
		ns := listenNotify(t)
		e := newEnv(t, lifecycleSub("billing", "orders", "", "sleep 0.3"))
		p := e.startWith(nil, ns.env, watchdog)
		ns.next(t, 20*time.Second, "READY=1")
		if n, gap := ns.pings(time.Second); n < 5 || gap > 500*time.Millisecond {
			t.Errorf("idle: %d pings in 1s, longest gap %s; want about 10, every 100ms", n, gap)
		}
		// 12 records of 0.3 s: busy for about 4 s.
		e.publish("b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11", "b12")
		eventually(t, 10*time.Second, "the first delivery", func() bool { return len(e.deliveries()) > 0 })
		if n, gap := ns.pings(time.Second); n < 5 || gap > 500*time.Millisecond {
			t.Errorf("busy (0.3s per record, timeout 10s): %d pings in 1s, longest gap %s; want about 10", n, gap)
		}
		if len(e.ended()) == 12 {
			t.Errorf("the handlers were done before the busy window ended; the check proved nothing")
		}
		if n := p.logCount("not pinging the watchdog"); n != 0 {
			t.Errorf("the daemon stopped pinging %d times", n)
		}
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
	})

	t.Run("wedged", func(t *testing.T) {
		ns := listenNotify(t)
		const shutdownTimeout = 250 * time.Millisecond // wedged after 2 × 250ms
		e := newEnv(t, `
[[subscription]]
name = "printer"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "stdout"
`)
		e.editConfig(`shutdown_timeout = "5s"`, fmt.Sprintf("shutdown_timeout = %q", shutdownTimeout))
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		p := e.startWith(w, ns.env, watchdog)
		w.Close()
		ns.next(t, 20*time.Second, "READY=1")
		if n, _ := ns.pings(500 * time.Millisecond); n < 2 {
			t.Fatalf("%d pings in 500ms before the wedge", n)
		}

		// 200 lines of 1 KiB fill the 64 KiB pipe: the handler blocks.
		lines := make([]string, 200)
		for i := range lines {
			lines[i] = fmt.Sprintf("w%03d-%s", i, strings.Repeat("x", 1024))
		}
		e.publish(lines...)
		eventually(t, 20*time.Second, "the daemon to stop pinging", func() bool { return p.logCount("not pinging the watchdog") > 0 })
		if n, _ := ns.pings(time.Second); n != 0 {
			t.Errorf("%d pings in 1s while the handler is blocked, want none", n)
		}
		if !strings.Contains(p.stderr.String(), `has been handling one record for`) {
			t.Errorf("the log does not say why it stopped pinging:\n%s", p.stderr.String())
		}

		// Unblock it: everything is printed and the pings come back.
		var out strings.Builder
		copied := make(chan error, 1)
		go func() { _, err := io.Copy(&out, r); copied <- err }()
		if n, _ := ns.pings(time.Second); n < 3 {
			t.Errorf("%d pings in the second after the handler was unblocked, want them back", n)
		}
		eventually(t, 10*time.Second, "every record printed", func() bool {
			pos, err := offsets.Load(e.stateDirPath())
			return err == nil && pos["printer"].LastSeq == 200
		})
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
		<-copied
		if n := strings.Count(out.String(), "\n"); n != 200 {
			t.Errorf("%d lines printed, want 200", n)
		}
	})
}

// TestSIGTERMWedgedHandler stops the daemon with SIGTERM while its stdout
// handler is blocked on a full pipe: Invariant 7 wants the exit within
// shutdown_timeout (the Handler contract: "It must return when ctx
// ends"), and the record stays unsettled, to be delivered again, as the
// log says.
func TestSIGTERMWedgedHandler(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = 500 * time.Millisecond
	e := newEnv(t, `
[[subscription]]
name = "printer"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "stdout"
`)
	e.editConfig(`shutdown_timeout = "5s"`, fmt.Sprintf("shutdown_timeout = %q", shutdownTimeout))
	lines := make([]string, 200)
	for i := range lines {
		lines[i] = fmt.Sprintf("w%03d-%s", i, strings.Repeat("x", 1024))
	}
	e.publish(lines...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := e.startWith(w)
	w.Close()
	// The pipe holds 64 KiB at most: the handler blocks once about 50
	// lines are in it and nobody reads them.
	last := -1
	eventually(t, 20*time.Second, "the stdout pipe to fill", func() bool {
		time.Sleep(200 * time.Millisecond)
		n, err := unix.IoctlGetInt(int(r.Fd()), unix.TIOCINQ) // FIONREAD: bytes in the pipe
		full := err == nil && n > 32<<10 && n == last
		last = n
		return full
	})
	p.cmd.Process.Signal(syscall.SIGTERM)
	sent := time.Now()
	var hung bool
	select {
	case <-p.done:
	case <-time.After(shutdownTimeout + 2*time.Second):
		hung = true
		go io.Copy(io.Discard, r) // let it go
		<-p.done
	}
	if hung {
		t.Errorf("no exit within shutdown_timeout (%s) + 2s after SIGTERM while the stdout handler is blocked "+
			"on a full stdout pipe; it exited only %s after SIGTERM, once the pipe was drained",
			shutdownTimeout, time.Since(sent).Round(time.Millisecond))
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if pos, _ := offsets.Load(e.stateDirPath()); pos["printer"].LastSeq >= 200 {
		t.Errorf("stored position %+v: the blocked record must stay unsettled", pos["printer"])
	}
	if want := `msg="shutdown_timeout passed with records not settled: cancelling their deliveries (an exec handler's command is killed); unsettled, they are delivered again when the subscription next runs" subscription=printer records=1 `; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("the log does not say that the delivery in flight was cancelled (%s):\n%s", want, p.stderr.String())
	}
}

// closingHandler acks every delivery and records whether it was closed.
type closingHandler struct {
	handled chan string
	closed  atomic.Bool
}

func (h *closingHandler) Handle(_ context.Context, d *handler.Delivery) handler.Outcome {
	if h.closed.Load() {
		h.handled <- "after close: " + string(d.Payload)
	} else {
		h.handled <- string(d.Payload)
	}
	return handler.Outcome{Kind: handler.OutcomeAck}
}

func (h *closingHandler) Close() error {
	h.closed.Store(true)
	return nil
}

// TestEmbedderHandlerStaysOpen: a handler given in Options.Handlers is the
// caller's. A reload that restarts its subscription keeps using it, and
// neither the reload nor the end of Run closes it.
func TestEmbedderHandlerStaysOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.writeConfig(xsub("billing", "orders", "", ``))
	load := func(concurrency int) func() (*conf.Config, error) {
		return func() (*conf.Config, error) {
			cfg, err := conf.Load(e.config, conf.ModeRun)
			if err == nil {
				cfg.Subscriptions[0].Concurrency = concurrency
			}
			return cfg, err
		}
	}
	cfg, err := load(1)()
	if err != nil {
		t.Fatal(err)
	}
	h := &closingHandler{handled: make(chan string, 10)}
	d := daemon.New(cfg, daemon.Options{Handlers: map[string]handler.Handler{"billing": h}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	next := func(want string) {
		t.Helper()
		select {
		case got := <-h.handled:
			if got != want {
				t.Fatalf("handled %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q was not handled", want)
		}
	}
	e.put("orders", nil, "first")
	next("first")
	if err := d.Reload(ctx, load(2)); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	e.put("orders", nil, "second")
	next("second")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if h.closed.Load() {
		t.Error("the daemon closed a handler it was given")
	}
}

// TestReloadLogLevel: a reload that changes the file's [log] level logs
// at the new level at once (a subscription it adds says at DEBUG which
// file it reads); one that changes [log] format is refused, restart
// required, unless --log.format fixes the format, as the tests' daemons
// run it.
func TestReloadLogLevel(t *testing.T) {
	t.Parallel()
	billing := lifecycleSub("billing", "orders", "", "")
	audit := lifecycleSub("audit", "audit", "", "")
	e := newEnv(t, billing)
	e.publish("o1")
	p := e.start()
	eventually(t, 20*time.Second, "o1", func() bool { return len(e.ended()) == 1 })
	reading := "level=DEBUG msg=reading"
	if n := p.logCount(reading); n != 0 {
		t.Fatalf("%d DEBUG lines at level info:\n%s", n, p.stderr.String())
	}
	hup := func(msg string, want int) {
		t.Helper()
		p.cmd.Process.Signal(syscall.SIGHUP)
		eventually(t, 10*time.Second, fmt.Sprintf("log %q", msg), func() bool { return p.logCount(msg) >= want })
	}
	e.writeConfig(billing + audit + "\n[log]\nlevel = \"debug\"\nformat = \"json\"\n")
	hup("configuration reloaded", 1)
	eventually(t, 10*time.Second, "a DEBUG line from the subscription the reload added", func() bool { return p.logCount(reading) >= 1 })
	if n := p.logCount("log level changed"); n != 1 {
		t.Errorf("%d lines say the log level changed, want 1:\n%s", n, p.stderr.String())
	}

	// Started without --log.format, the same daemon refuses a change of
	// format, and keeps its level.
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	e.writeConfig(billing + "\n[log]\nlevel = \"debug\"\nformat = \"text\"\n")
	cmd := exec.Command(streamdBinary(t), "run", "--config.file="+e.config)
	p = e.launch(cmd)
	eventually(t, 20*time.Second, "billing's file read at DEBUG", func() bool { return p.logCount(reading) >= 1 })
	e.writeConfig(billing + "\n[log]\nlevel = \"debug\"\nformat = \"json\"\n")
	hup("reload failed; the previous configuration keeps running", 1)
	if log := p.stderr.String(); !strings.Contains(log, `log format changed from \"text\" to \"json\": restart required`) {
		t.Errorf("the log does not say why:\n%s", log)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}
