package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gone reports whether process pid has ended: it no longer exists, or is
// a zombie waiting for a reaper.
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	_, after, _ := bytes.Cut(b, []byte(") "))
	return len(after) > 0 && after[0] == 'Z'
}

// TestRunExecHandlerDiesWithDaemon: an exec handler reading a 200 KB
// payload slowly is gone within a second of a kill -9 of the daemon, and
// the environment gives the payload's length, so that a handler can tell
// a payload cut short from a whole one.
func TestRunExecHandlerDiesWithDaemon(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSubTable("billing", "orders", "", `echo $$ > LOG.pid
n=0
while [ $n -lt 200 ]; do head -c 1000 >> LOG.payload; sleep 0.05; n=$((n+1)); done
echo "$STREAMD_PAYLOAD_LENGTH $(wc -c < LOG.payload)" >> LOG`))
	payload := strings.Repeat("p", 200_000)
	e.publish(payload)
	p := e.start()
	var pid int
	eventually(t, 10*time.Second, "the handler reading", func() bool {
		b, _ := os.ReadFile(e.log + ".pid")
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		fi, err := os.Stat(e.log + ".payload")
		return pid > 0 && err == nil && fi.Size() > 0
	})
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	killed := time.Now()
	eventually(t, time.Second, "the handler gone", func() bool { return gone(pid) })
	t.Logf("the handler was gone %s after the kill", time.Since(killed).Round(time.Millisecond))

	// A whole delivery: the length in the environment is what was read.
	if err := os.Remove(e.log + ".payload"); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(execSubTable("billing", "orders", "", `cat > LOG.payload; echo "$STREAMD_PAYLOAD_LENGTH $(wc -c < LOG.payload)" >> LOG`))
	p = e.start()
	eventually(t, 10*time.Second, "the delivery", func() bool { return len(e.deliveries()) == 1 })
	if got := e.deliveries(); got[0] != "200000 200000" {
		t.Errorf("STREAMD_PAYLOAD_LENGTH and the bytes read: %q, want 200000 200000", got[0])
	}
	if code := p.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
}
