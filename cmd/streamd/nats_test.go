package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/natstest"
)

// natsSub is a [[subscription]] named billing on key orders, with the TOML
// extra, forwarding to the subject orders.{key} of the NATS server at url.
func natsSub(url, extra string) string {
	return fmt.Sprintf(`
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
%s
[subscription.handler]
kind = "nats"
url = %q
subject = "orders.{key}"
timeout = "2s"
`, extra, url)
}

// TestNATSNoStream checks that when no JetStream stream captures the
// subject, check-config --handlers and streamd run fail naming it.
func TestNATSNoStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
	e := newEnv(t, natsSub(srv.URL(), ""))
	const want = `subscription "billing": nats handler: subject "orders.orders": no JetStream stream captures it`

	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "--handlers", "--config.file=" + e.config}, stdio{strings.NewReader(""), &out, &errOut}); code != exitError {
		t.Errorf("check-config --handlers: exit code %d, want %d", code, exitError)
	}
	if !strings.Contains(errOut.String(), want) {
		t.Errorf("check-config --handlers: stderr %q does not say %q", errOut.String(), want)
	}

	p := e.start()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("streamd run did not exit without a stream for its subject")
	}
	if code := p.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("streamd run: exit code 0 without a stream for its subject")
	}
	if logged := strings.ReplaceAll(p.stderr.String(), `\"`, `"`); !strings.Contains(logged, want) {
		t.Errorf("streamd run: stderr %q does not say %q", logged, want)
	}
}
