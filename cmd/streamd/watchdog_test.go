package main

import (
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/failpoint"
)

// TestWatchdogHungCommitLoop hangs the commit loop inside the commit of the
// first record's position (the failpoint offsets.commit armed with :hang at
// its third hit, the first two being the commits at start, the second of
// the subscription's start position, as a hung fsync would)
// and checks that WATCHDOG=1 stops, with the reason logged, while handlers
// and followers are idle and would not stop it.
func TestWatchdogHungCommitLoop(t *testing.T) {
	ns := listenNotify(t)
	e := newEnv(t, lifecycleSub("billing", "orders", "", "true"))
	p := e.startWith(nil,
		failpoint.EnvVar+"="+failpoint.OffsetsCommit+"=3:hang",
		ns.env,
		"WATCHDOG_USEC=200000", // a ping every 100ms, a timeout of 200ms
	)
	defer p.kill9(t)
	ns.next(t, 20*time.Second, "READY=1")
	if n, _ := ns.pings(300 * time.Millisecond); n < 2 {
		t.Fatalf("%d pings in 300ms before the hang, want about 3", n)
	}
	e.publish("a") // a position to commit: the commit hangs
	eventually(t, 20*time.Second, "the commit to hang", func() bool {
		return strings.Contains(p.stderr.String(), "failpoint: offsets.commit: hit 3: hang")
	})
	eventually(t, 5*time.Second, "the daemon to stop pinging", func() bool { return p.logCount("not pinging the watchdog") > 0 })
	if n, _ := ns.pings(time.Second); n != 0 {
		t.Errorf("%d pings in 1s while the commit loop hangs, want none", n)
	}
	if !strings.Contains(p.stderr.String(), "the commit loop has not finished a commit for") {
		t.Errorf("the log does not say why it stopped pinging:\n%s", p.stderr.String())
	}
}
