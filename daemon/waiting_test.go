package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/metrics"
	"github.com/streamd/streamd/streamfile"
)

// streamSub is a [[stream]] table for path and a [[subscription]] table
// of the same name reading key name on it.
func streamSub(name, path, extra string) string {
	return fmt.Sprintf("\n[[stream]]\nname = %q\npath = %q\npoll_interval = \"50ms\"\n%s\n", name, path, extra) +
		strings.Replace(runSub(name, name, ""), `stream = "orders"`, fmt.Sprintf("stream = %q", name), 1)
}

// publishFile makes the stream file at path hold payloads under key, as a
// producer that replaces a damaged file does: written aside, then renamed
// over the path.
func publishFile(t *testing.T, path, key string, payloads ...string) {
	t.Helper()
	tmp := path + ".new"
	a, err := streamfile.OpenAppender(tmp, streamfile.AppendOptions{Create: true, BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	frames := make([]streamfile.Frame, len(payloads))
	for i, p := range payloads {
		frames[i] = streamfile.Frame{Key: key, TimestampMs: uint64(time.Now().UnixMilli()), Payload: []byte(p)}
	}
	if err := errors.Join(a.Publish(frames), a.Sync(), a.Close(), os.Rename(tmp, path)); err != nil {
		t.Fatal(err)
	}
}

// TestRunBrokenStream: a stream file that is not a stream file at start
// (4,096 zero bytes) stops neither the daemon nor the other stream. Its
// subscription is unhealthy with a reason naming the stream and the error,
// counted once under reason format and logged once, and starts by itself
// when a stream file replaces the bad one. A stream added by a reload
// whose file is missing (create = false) is the same: the reload succeeds,
// and the subscription starts once the file appears.
func TestRunBrokenStream(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t, "")
	bad := filepath.Join(e.dir, "bad.ss")
	if err := os.WriteFile(bad, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	e.config = runSub("billing", "orders", "") + streamSub("bad", bad, "")
	e.put("orders", nil, "o1")
	billing, audit, late := newRecorder(nil), newRecorder(nil), newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": billing, "bad": audit, "late": late})
	billing.waitN(t, 1)
	health := func() string {
		if err := r.d.metrics.Health().Err(); err != nil {
			return err.Error()
		}
		return ""
	}
	waitFor(t, "the bad stream in /healthz", func() bool { return strings.Contains(health(), `subscription "bad": waiting`) })
	for _, want := range []string{`stream "bad"`, bad, "not a stream file"} {
		if !strings.Contains(health(), want) {
			t.Errorf("health %q lacks %q", health(), want)
		}
	}
	if strings.Contains(health(), "billing") {
		t.Errorf("health %q reports the healthy subscription", health())
	}
	e.put("orders", nil, "o2")
	billing.waitN(t, 2)
	if b, err := os.ReadFile(bad); err != nil || len(b) != 4096 || strings.Trim(string(b), "\x00") != "" {
		t.Fatalf("the bad file was changed: %d bytes, %v", len(b), err)
	}

	publishFile(t, bad, "bad", "x", "y")
	if got := audit.waitN(t, 2); string(got[0].Payload) != "x" || string(got[1].Payload) != "y" {
		t.Fatalf("deliveries of the repaired stream: %q", audit.seen())
	}
	waitFor(t, "/healthz to be ok", func() bool { return health() == "" })
	sm := r.d.metrics.Subscription("bad", "bad")
	if n := testutil.ToFloat64(sm.ReadErrors[metrics.ReasonFormat]); n != 1 {
		t.Errorf("read errors {reason=format} = %v, want 1 (once per spell)", n)
	}
	if n := len(r.logs.with("stream file cannot be read; the subscription waits for it while the others run")); n != 1 {
		t.Errorf("%d lines about the bad file, want 1", n)
	}
	// The subscription starts, and may deliver, before the line is logged.
	waitFor(t, "the line about its recovery", func() bool { return len(r.logs.with("stream file can be read; the subscription starts")) == 1 })

	lateFile := filepath.Join(e.dir, "late.ss")
	e.config += streamSub("late", lateFile, "create = false")
	if err := r.d.Reload(context.Background(), func() (*conf.Config, error) { return e.load(), nil }); err != nil {
		t.Fatalf("reload adding a stream whose file is missing: %v", err)
	}
	waitFor(t, "the late stream in /healthz", func() bool {
		return strings.Contains(health(), `subscription "late": waiting`) && strings.Contains(health(), "create = false")
	})
	if _, err := os.Stat(lateFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the missing file was created: %v", err)
	}
	publishFile(t, lateFile, "late", "z")
	late.waitN(t, 1)
	waitFor(t, "/healthz to be ok again", func() bool { return health() == "" })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := len(billing.deliveries()) + len(audit.deliveries()); got != 4 {
		t.Fatalf("%d deliveries on the first two streams, want 4", got)
	}
}

// startDelivered starts a daemon with one subscription, billing, of
// stream orders (rotation_grace 0s), and returns once its first record was
// delivered to the returned recorder.
func startDelivered(t *testing.T) (*runEnv, *runningDaemon, *recorder) {
	t.Helper()
	e := newRunEnv(t, "rotation_grace = \"0s\"\n"+runSub("billing", "orders", ""))
	e.put("orders", nil, "o1")
	billing := newRecorder(nil)
	r := e.start(map[string]handler.Handler{"billing": billing})
	billing.waitN(t, 1)
	return e, r, billing
}

// TestRunStreamFileSpoiled: a file that is not a stream file renamed over
// the stream path while the subscription runs makes it unhealthy, with the
// reason a subscription waiting for its file at start has (the stream, the
// path, the problem), as long as it lasts; a stream file renamed over it
// in turn is read, and the subscription is healthy again.
func TestRunStreamFileSpoiled(t *testing.T) {
	t.Parallel()
	e, r, billing := startDelivered(t)
	health := func() string {
		if err := r.d.metrics.Health().Err(); err != nil {
			return err.Error()
		}
		return ""
	}
	waitFor(t, "/healthz to be ok", func() bool { return health() == "" })

	junk := filepath.Join(e.dir, "junk")
	if err := errors.Join(os.WriteFile(junk, []byte("junk\n"), 0o644), os.Rename(junk, e.stream)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription in /healthz", func() bool { return health() != "" })
	want := `subscription "billing": waiting for its stream file, tried again every 50ms: stream "orders": `
	if got := health(); !strings.HasPrefix(got, want) || !strings.Contains(got, e.stream) || !strings.Contains(got, "not a stream file") {
		t.Errorf("health %q; want %q, the path and that it is not a stream file", got, want+"...")
	}

	publishFile(t, e.stream, "orders", "o2")
	if got := billing.waitN(t, 2); string(got[1].Payload) != "o2" {
		t.Fatalf("deliveries %q, want o1 then o2", billing.seen())
	}
	if got := health(); got != "" {
		t.Errorf("health %q once a stream file took the path again, want ok", got)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestSubHealth: a subscription is unhealthy while its stream file cannot
// be read or its copies cannot be written, with both reasons, and the end
// of one leaves it unhealthy for the other.
func TestSubHealth(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	h := &subHealth{m: m.Subscription("billing", "orders")}
	h.m.SetHealthy(true, "")
	for _, step := range []struct {
		set  func(string)
		to   string
		want string
	}{
		{h.setFile, "no file", `subscription "billing": no file`},
		{h.setCopies, "no copies", `subscription "billing": no file; no copies`},
		{h.setCopies, "", `subscription "billing": no file`},
		{h.setCopies, "no copies", `subscription "billing": no file; no copies`},
		{h.setFile, "", `subscription "billing": no copies`},
		{h.setCopies, "", ""},
	} {
		step.set(step.to)
		got := ""
		if err := m.Health().Err(); err != nil {
			got = err.Error()
		}
		if got != step.want {
			t.Fatalf("health %q, want %q", got, step.want)
		}
	}
}
