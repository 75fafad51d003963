package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestOriginAcrossDaemons (issue 15, acceptance 9): two daemons with state
// directories of their own read one file; the first asks for a retry of
// every record on its first attempt, the other only records what it gets.
// The other handles each record exactly once: a copy that carries an
// origin is for that origin only, whichever daemon reads it.
func TestOriginAcrossDaemons(t *testing.T) {
	t.Parallel()
	a := newEnv(t, lifecycleSub("billing", "orders", "max_attempts = 3",
		`if [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry; fi`))
	b := newEnv(t, "")
	b.stream = a.stream // the same file, another state directory
	b.writeConfig(lifecycleSub("audit", "orders", "", ""))
	a.publish("r1", "r2", "r3")
	pa, pb := a.start(), b.start()
	eventually(t, 20*time.Second, "billing to handle the originals and their copies", func() bool { return len(a.ended()) == 6 })
	eventually(t, 20*time.Second, "audit to read past the copies", committedAtEnd(b, "audit"))
	if code := pa.stop(t); code != 0 {
		t.Fatalf("first daemon: exit %d", code)
	}
	if code := pb.stop(t); code != 0 {
		t.Fatalf("second daemon: exit %d", code)
	}
	if got, want := b.ended(), []string{"audit 1 1 r1", "audit 2 1 r2", "audit 3 1 r3"}; !slices.Equal(got, want) {
		t.Errorf("the second daemon handled %q, want each original once", got)
	}
	if _, err := os.Stat(filepath.Join(b.dir, "state", "offsets.json")); err != nil {
		t.Errorf("the second daemon's own state: %v", err)
	}
}
