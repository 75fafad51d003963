package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSecondSignal: a second stop signal ends a stop that waits for a
// handler, with exit status 1 and an ERROR that says what is left, instead
// of the wait of shutdown_timeout.
func TestSecondSignal(t *testing.T) {
	t.Parallel()

	// The daemon: the record whose handler was cut off is delivered again
	// at the next start.
	t.Run("run", func(t *testing.T) {
		t.Parallel()
		// The command waits for a process it started, which the exit
		// kills too: the kernel's parent-death signal reaches only the
		// command.
		e := newEnv(t, execSub("hangs", "", "sleep 30 & echo $! > LOG.pid; wait"))
		e.editConfig(`shutdown_timeout = "5s"`, `shutdown_timeout = "30s"`)
		e.publish("a")
		p := e.start()
		var started int
		eventually(t, 10*time.Second, "the delivery", func() bool {
			b, _ := os.ReadFile(e.log + ".pid")
			started, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return len(e.deliveries()) == 1 && started > 0
		})
		p.cmd.Process.Signal(syscall.SIGTERM)
		eventually(t, 10*time.Second, "the stop's log", func() bool { return strings.Contains(p.stderr.String(), "msg=stopping") })
		time.Sleep(sameStop + 200*time.Millisecond) // a signal sooner is taken for the same stop
		p.cmd.Process.Signal(syscall.SIGINT)
		sent := time.Now()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("no exit within 10s of the second signal; stderr:\n%s", p.stderr.String())
		}
		if code, d := p.cmd.ProcessState.ExitCode(), time.Since(sent); code != exitError || d > 5*time.Second {
			t.Errorf("exit status %d %s after the second signal, want 1 at once", code, d.Round(time.Millisecond))
		}
		if !strings.Contains(p.stderr.String(), "level=ERROR msg=\"streamd exits at a second signal without finishing its stop: the records not settled are delivered again at the next start\" signal=interrupt") {
			t.Errorf("want an ERROR saying why; stderr:\n%s", p.stderr.String())
		}
		eventually(t, 5*time.Second, "the end of the process the command started", func() bool {
			return !running(started)
		})
		e.writeConfig(execSub("hangs", "", "echo outcome=drop"))
		p = e.start()
		eventually(t, 10*time.Second, "the delivery again", func() bool { return len(e.deliveries()) == 2 })
		if got := e.deliveries(); got[1] != got[0] {
			t.Errorf("deliveries %q, want the same record twice", got)
		}
		p.stop(t)
	})

	// The one signal sent twice at once, as timeout(1) sends it to the
	// process and to its group: one graceful stop, which cuts the handler
	// off at shutdown_timeout, with exit status 0.
	t.Run("sent twice at once", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, execSub("hangs", "", "sleep 30"))
		e.editConfig(`shutdown_timeout = "5s"`, `shutdown_timeout = "1s"`)
		e.publish("a")
		p := e.start()
		eventually(t, 10*time.Second, "the delivery", func() bool { return len(e.deliveries()) == 1 })
		p.cmd.Process.Signal(syscall.SIGTERM)
		// The second once the first was taken: two signals sent before
		// either is delivered are one.
		eventually(t, 10*time.Second, "the stop's log", func() bool { return strings.Contains(p.stderr.String(), "msg=stopping") })
		p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.waitExit(t, 15*time.Second); code != 0 {
			t.Errorf("exit status %d, want 0: one stop; stderr:\n%s", code, p.stderr.String())
		}
	})

	// A pipe stage: the stop would wait for the handler (shutdown_timeout)
	// and then hand the record on as a retry copy. The log names the last
	// line dealt with, for the operator to feed the rest again.
	t.Run("pipe", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		cfg := writeStageConfig(t, dir, "pipe.toml", `shutdown_timeout = "30s"`,
			stageSub("jobs", "jobs", `out_retry = "jobs.retry"`, `IFS= read -r p; echo "$p" >> "$DIR/log"; [ "$p" = first ] || sleep 30`))
		p := startStage(t, dir, stageKeepStdout, streamdBinary(t), "pipe", "--config.file="+cfg, "--log.format=json")
		p.write(t, "[jobs] first")
		p.write(t, "[jobs] a")
		eventually(t, 10*time.Second, "the handler of the second line", func() bool {
			b, _ := os.ReadFile(filepath.Join(dir, "log"))
			return string(b) == "first\na\n"
		})
		p.cmd.Process.Signal(syscall.SIGTERM)
		eventually(t, 10*time.Second, "the stop's log", func() bool { return len(logsWithMsg(p.stderr.String(), "stopping")) == 1 })
		time.Sleep(sameStop + 200*time.Millisecond) // a signal sooner is taken for the same stop
		p.cmd.Process.Signal(syscall.SIGTERM)
		sent := time.Now()
		if code, d := p.wait(t, 10*time.Second), time.Since(sent); code != exitError || d > 5*time.Second {
			t.Errorf("exit status %d %s after the second signal, want 1 at once", code, d.Round(time.Millisecond))
		}
		l := logsWithMsg(p.stderr.String(), "streamd pipe exits at a second signal without finishing its stop: the copies not written are lost (one being written may be left cut short on stdout, which the next stage takes as a record), and so are the lines after last_line, which may have been read ahead; feed the input to a stage again from resume_line")
		if len(l) != 1 || l[0].str("level") != "ERROR" || l[0].str("signal") != "terminated" || l[0].str("last_line") != "1" {
			t.Errorf("want one ERROR saying why; stderr:\n%s", p.stderr.String())
		}
	})
}

// running reports whether the process pid runs: it exists and is not a
// zombie, which its new parent (the container's init, which may be slow
// to) has yet to reap.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, in parentheses that the name
	// itself may hold.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}
