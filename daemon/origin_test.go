package daemon

import (
	"testing"

	"github.com/streamd/streamd/handler"
)

// TestRunOriginAcrossDaemons: two daemons with state directories of their
// own read one file. The first asks for a retry of every record; the
// other handles each original record exactly once and passes over the
// first one's copies, as a subscription of the same daemon would: a copy
// that carries an origin is for that origin only.
func TestRunOriginAcrossDaemons(t *testing.T) {
	t.Parallel()
	a := newRunEnv(t, runSub("billing", "orders", "max_attempts = 3"))
	b := &runEnv{t: t, dir: t.TempDir(), stream: a.stream, config: runSub("audit", "orders", ""), shutdownTimeout: "5s"}
	a.put("orders", nil, "r1", "r2", "r3")
	billing := newRecorder(retryFirstAttempt(retry))
	audit := newRecorder(nil)
	ra := a.start(map[string]handler.Handler{"billing": billing})
	rb := b.start(map[string]handler.Handler{"audit": audit})
	billing.waitN(t, 6) // three originals and their copies
	waitFor(t, "the other daemon to read past the copies", func() bool {
		return rb.metric("audit", "foreign_copy") == 3
	})
	if err := ra.stop(); err != nil {
		t.Fatal(err)
	}
	if err := rb.stop(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range audit.deliveries() {
		got = append(got, string(d.Payload))
	}
	if len(got) != 3 || got[0] != "r1" || got[1] != "r2" || got[2] != "r3" {
		t.Errorf("the other daemon handled %q, want each original once", got)
	}
	for _, r := range a.records("orders")[3:] {
		if r.header(OriginHeader) != "billing" {
			t.Errorf("copy %d carries origin %q, want billing", r.seq, r.header(OriginHeader))
		}
	}
}
