package daemon

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/testutil"
)

// notifySocket is a fake $NOTIFY_SOCKET that the daemons New makes in the
// test send their sd_notify messages to.
type notifySocket struct {
	conn *net.UnixConn
}

// listenNotify listens on a fresh socket and sets $NOTIFY_SOCKET to it for
// the test.
func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	conn, path := testutil.ListenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	return &notifySocket{conn: conn}
}

// next returns the next message, failing the test if none arrives within
// timeout; what says what the test waits for.
func (n *notifySocket) next(t *testing.T, timeout time.Duration, what string) string {
	t.Helper()
	if err := n.conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	k, err := n.conn.Read(buf)
	if err != nil {
		t.Fatalf("no sd_notify message within %s, waiting for %s: %v", timeout, what, err)
	}
	return string(buf[:k])
}

// skipTo reads messages until one that starts with prefix, and returns it.
func (n *notifySocket) skipTo(t *testing.T, prefix string) string {
	t.Helper()
	for {
		if m := n.next(t, 10*time.Second, prefix); strings.HasPrefix(m, prefix) {
			return m
		}
	}
}

// TestWatchdogDuringReload: a reload that stops a subscription waits for
// its delivery in flight (here until the test releases the handler, within
// the shutdown timeout); the watchdog keeps being pinged meanwhile, at its
// interval, and the reload ends with READY=1 once the handler returns.
func TestWatchdogDuringReload(t *testing.T) {
	ns := listenNotify(t)
	// A ping every 500ms. The daemon stops pinging when no commit has
	// finished for the commit interval and the watchdog timeout (1s
	// here): on a busy machine one fsync of the sidecar can outlast a
	// shorter timeout.
	t.Setenv("WATCHDOG_USEC", "1000000")
	t.Setenv("WATCHDOG_PID", "")
	e := newRunEnv(t, runSub("s", "orders", ""))
	e.put("orders", nil, "a")
	release := make(chan struct{})
	releaseHandler := sync.OnceFunc(func() { close(release) })
	rec := newRecorder(func(ctx context.Context, _ *handler.Delivery) handler.Outcome {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return ack
	})
	r := e.start(map[string]handler.Handler{"s": rec})
	t.Cleanup(releaseHandler) // before the daemon stops
	ns.skipTo(t, "READY=1")
	rec.waitN(t, 1)

	e.config = runSub("s", "orders", "max_attempts = 3") // changed: stopped and started again
	cfg := e.load()
	reloaded := make(chan error, 1)
	go func() { reloaded <- r.d.Reload(context.Background(), func() (*conf.Config, error) { return cfg, nil }) }()
	ns.skipTo(t, "RELOADING=1")
	for ping := 1; ping <= 3; ping++ {
		if m := ns.next(t, 3*time.Second, "WATCHDOG=1 while the reload waits for the handler"); m != "WATCHDOG=1" {
			t.Fatalf("message %q while the reload waits for the handler, want WATCHDOG=1", m)
		}
	}
	select {
	case err := <-reloaded:
		t.Fatalf("the reload returned (%v) before the handler did; the pings proved nothing", err)
	default:
	}

	releaseHandler()
	if err := <-reloaded; err != nil {
		t.Fatalf("reload: %v", err)
	}
	ns.skipTo(t, "READY=1")
	if l := r.logs.with("not pinging the watchdog"); len(l) != 0 {
		t.Errorf("the daemon stopped pinging:\n%s", logLines(l))
	}
}

// TestWatchdogWhileReloadBuildsHandlers: a reload that builds a nats
// handler whose server accepts and never answers waits up to the handler's
// timeout (one per server listed); the watchdog keeps being pinged
// meanwhile, at its interval, and a stop during the build still ends the
// reload at once.
func TestWatchdogWhileReloadBuildsHandlers(t *testing.T) {
	ns := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "1000000") // a ping every 500ms, as in TestWatchdogDuringReload
	t.Setenv("WATCHDOG_PID", "")
	e := newRunEnv(t, runSub("s", "orders", ""))
	r := e.start(nil)
	ns.skipTo(t, "READY=1")

	silent, reloaded := reloadToSilentNATS(t, e, r)
	ns.skipTo(t, "RELOADING=1")
	for ping := 1; ping <= 3; ping++ {
		if m := ns.next(t, 3*time.Second, "WATCHDOG=1 while the reload builds the nats handler"); m != "WATCHDOG=1" {
			t.Fatalf("message %q while the reload builds the nats handler, want WATCHDOG=1", m)
		}
	}
	if len(silent.Accepts()) == 0 {
		t.Fatal("the nats handler has not connected to its server; the pings proved nothing")
	}
	select {
	case err := <-reloaded:
		t.Fatalf("the reload returned (%v) before the handler's timeout (1m); the pings proved nothing", err)
	default:
	}
	stopDuringBuild(t, r, reloaded)
}
