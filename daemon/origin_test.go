package daemon

import (
	"testing"

	"github.com/streamd/streamd/envelope"
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

// TestRunRenamedFrom: copies made under a subscription's former name are
// its own when renamed_from lists it, and passed over otherwise.
func TestRunRenamedFrom(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, runSub("invoicing", "orders", `renamed_from = ["billing", "old-billing"]`)+runSub("audit", "orders", ""))
	e.put("orders", nil, "r1")
	e.put("orders", envelope.Headers{{Name: OriginHeader, Value: []byte("billing")}, {Name: envelope.RetryCountHeader, Value: []byte("1")}}, "c1")
	e.put("orders", envelope.Headers{{Name: OriginHeader, Value: []byte("someone-else")}}, "c2")
	invoicing, audit := newRecorder(nil), newRecorder(nil)
	r := e.start(map[string]handler.Handler{"invoicing": invoicing, "audit": audit})
	invoicing.waitN(t, 2)
	waitFor(t, "audit to pass over both copies", func() bool { return r.metric("audit", "foreign_copy") == 2 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	got := invoicing.deliveries()
	if len(got) != 2 || string(got[0].Payload) != "r1" || string(got[1].Payload) != "c1" || got[1].Attempt != 2 {
		t.Errorf("invoicing handled %v, want r1 and the copy c1 made under its former name, at attempt 2", got)
	}
	if n := r.metric("invoicing", "foreign_copy"); n != 1 {
		t.Errorf("invoicing passed over %v copies, want the one of another subscription", n)
	}
	if len(audit.deliveries()) != 1 {
		t.Errorf("audit handled %d records, want the original alone", len(audit.deliveries()))
	}
}
