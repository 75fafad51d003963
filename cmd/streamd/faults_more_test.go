package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/offsets"
)

// nobody is the uid and gid the daemon runs as where a file must be
// unreadable to it: root reads any file whatever its mode.
const nobody = 65534

// asNobody prepares e for a daemon running as nobody, or skips the test
// saying why it cannot: the test directory and its parent become
// searchable, e's directory (state, delivery log) and stream file
// nobody's, and so does the directory of the binary, which it returns.
// (A copy of the binary would be open for writing while parallel tests
// fork: a child that inherits the descriptor makes its exec fail with
// "text file busy".)
func asNobody(t *testing.T, e *env) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running the daemon as another user (so that a file can be unreadable to it) needs root")
	}
	bin := streamdBinary(t)
	for _, d := range []string{filepath.Dir(e.dir), e.dir, filepath.Dir(bin)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(e.dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.stream); err == nil {
		if err := os.Chown(e.stream, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// committedThrough reports, when called, whether the sidecar in state stores
// subscription name's position after seq.
func committedThrough(state, name string, seq uint64) func() bool {
	return func() bool {
		s, err := offsets.Load(state)
		return err == nil && s[name].LastSeq == seq
	}
}

// committedAtEnd reports, when called, whether the sidecar stores
// subscription name's position at the end of the file now at e's stream
// path.
func committedAtEnd(e *env, name string) func() bool {
	return func() bool {
		s, err := offsets.Load(e.stateDirPath())
		fi, serr := os.Stat(e.stream)
		return err == nil && serr == nil && s[name].File.Ino == fi.Sys().(*syscall.Stat_t).Ino && s[name].Offset == fi.Size()
	}
}

// startAs runs the daemon binary bin on e's config as uid and gid id, like
// env.start.
func (e *env) startAs(bin string, id uint32) *daemonProc {
	e.t.Helper()
	cmd := e.daemonCmd(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id}}
	return e.launch(cmd)
}

// publishTo appends lines under key orders to the stream file at path,
// creating it when missing (without the race runtime's second at exit).
func publishTo(t *testing.T, path string, lines ...string) {
	t.Helper()
	cmd := exec.Command(streamdBinary(t), "publish", "--file="+path, "--key=orders", "--beacon-interval=1024")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	cmd.Env = quickExit()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("publish: %v: %s", err, out)
	}
}

// payloadsDelivered returns how often each payload reached the handler of
// an execSub ("seq attempt payload" lines).
func (e *env) payloadsDelivered() map[string]int {
	n := map[string]int{}
	for _, l := range e.deliveries() {
		if f := strings.Fields(l); len(f) == 3 {
			n[f[2]]++
		}
	}
	return n
}

// fileChanges is the series of streamd_stream_file_changes_total for
// subscription billing of stream orders with the given change, as
// /metrics writes it.
func fileChanges(change string) string {
	return fmt.Sprintf(`streamd_stream_file_changes_total{change=%q,stream="orders",subscription="billing"}`, change)
}

// chmod changes the mode of the file at path.
func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// inode returns the inode number of the file at path.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestFaultUnreadableStream makes the stream file unreadable to a running
// daemon (run as nobody, since root reads anything) in each way a path can
// stop giving readable records, then makes it readable again:
//
//   - made unreadable in place (chmod 000), or renamed away: the daemon
//     keeps reading through the descriptor it holds, as it should;
//   - replaced by a file it may not open, or by a directory: the records
//     of the old file are all delivered, the replacement is counted
//     (streamd_stream_file_changes_total{change="replaced"}) and logged once
//     with the path and the error (rate-limited while it lasts), the stored
//     position stays at the end of the old file, the daemon keeps running
//     and trying, and once the file is readable it reads it from its
//     beginning by itself.
//
// Every record is delivered exactly once (the handler acks), and records
// published after the repair flow at once.
func TestFaultUnreadableStream(t *testing.T) {
	t.Parallel()
	const unopenable = "stream file replaced by a file that cannot be opened"
	tests := []struct {
		name string
		// fault makes the file unreadable and publishes the payloads
		// "during-*" where the daemon will read them.
		fault func(t *testing.T, e *env)
		// blocked: the records published during the fault wait for the
		// repair; otherwise they are delivered during the fault.
		blocked bool
		change  string // the file change counted once, or ""
		// mayRemove: the fault may be seen as a removal first.
		mayRemove bool
		errText   string // in the log line about the replacement
		repair    func(t *testing.T, e *env)
	}{
		{
			name: "chmod 000 in place",
			fault: func(t *testing.T, e *env) {
				chmod(t, e.stream, 0)
				publishTo(t, e.stream, "during-1", "during-2")
			},
			repair: func(t *testing.T, e *env) { chmod(t, e.stream, 0o644) },
		},
		{
			name: "renamed away and back",
			fault: func(t *testing.T, e *env) {
				if err := os.Rename(e.stream, e.stream+".away"); err != nil {
					t.Fatal(err)
				}
				publishTo(t, e.stream+".away", "during-1", "during-2")
			},
			change: "removed",
			repair: func(t *testing.T, e *env) {
				if err := os.Rename(e.stream+".away", e.stream); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "replaced by a file it may not open",
			fault: func(t *testing.T, e *env) {
				tmp := e.stream + ".new"
				publishTo(t, tmp, "during-1") // root's, 0644
				if err := os.Chmod(tmp, 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, e.stream); err != nil {
					t.Fatal(err)
				}
				publishTo(t, e.stream, "during-2")
			},
			blocked: true,
			change:  "replaced",
			errText: "permission denied",
			repair:  func(t *testing.T, e *env) { chmod(t, e.stream, 0o644) },
		},
		{
			name: "replaced by a directory",
			fault: func(t *testing.T, e *env) {
				if err := os.Remove(e.stream); err != nil {
					t.Fatal(err)
				}
				if err := os.Mkdir(e.stream, 0o755); err != nil {
					t.Fatal(err)
				}
				publishTo(t, e.stream+".new", "during-1", "during-2")
			},
			blocked:   true,
			change:    "replaced",
			mayRemove: true,
			errText:   "is a directory",
			repair: func(t *testing.T, e *env) {
				if err := os.Remove(e.stream); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(e.stream+".new", e.stream); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, execSub("billing", "", ""))
			e.editConfig(`poll_interval = "200ms"`, `poll_interval = "50ms"`)
			addr := e.withMetrics()
			publishTo(t, e.stream, "before-1", "before-2", "before-3")
			bin := asNobody(t, e)
			p := e.startAs(bin, nobody)
			eventually(t, 10*time.Second, "the records before the fault", func() bool { return len(e.deliveries()) == 3 })
			eventually(t, 5*time.Second, "their position to be committed", func() bool {
				s, err := offsets.Load(e.stateDirPath())
				return err == nil && s["billing"].LastSeq == 3
			})
			oldIno := inode(t, e.stream)
			oldSize := fileSize(t, e.stream)

			tt.fault(t, e)
			during := []string{"during-1", "during-2"}
			if !tt.blocked {
				eventually(t, 10*time.Second, "the records published during the fault", func() bool {
					d := e.payloadsDelivered()
					return d["during-1"] == 1 && d["during-2"] == 1
				})
			} else {
				eventually(t, 10*time.Second, "the replacement to be reported", func() bool {
					return strings.Contains(p.stderr.String(), unopenable)
				})
				// Six polls (50 ms) later: still nothing more delivered,
				// still one log line, the position at the old file's end.
				time.Sleep(300 * time.Millisecond)
				if d := e.payloadsDelivered(); d["during-1"]+d["during-2"] != 0 {
					t.Fatalf("deliveries %v: a record of the file that cannot be opened was delivered", d)
				}
				lines := slogRecords(p.stderr.String(), unopenable)
				if len(lines) != 1 {
					t.Errorf("%d log lines %q in six polls, want 1 (rate-limited)", len(lines), unopenable)
				} else if l := lines[0]; l["level"] != "ERROR" || l["path"] != e.stream || !strings.Contains(l["err"], tt.errText) {
					t.Errorf("log line %v: want level ERROR, path %s and an error with %q", l, e.stream, tt.errText)
				}
				s, err := offsets.Load(e.stateDirPath())
				if pos := s["billing"]; err != nil || pos.File.Ino != oldIno || pos.Offset != oldSize || pos.LastSeq != 3 {
					t.Errorf("stored position %+v (%v) while the new file cannot be opened; want the end of the old file (ino %d, offset %d)",
						pos, err, oldIno, oldSize)
				}
				select {
				case <-p.done:
					t.Fatalf("the daemon exited: %s", p.cmd.ProcessState)
				default:
				}
			}
			for _, change := range []string{"replaced", "removed", "truncated"} {
				want := 0.0
				if change == tt.change {
					want = 1
				}
				got := metricValue(t, addr, fileChanges(change))
				if change == "removed" && tt.mayRemove {
					want = got
				}
				if got != want {
					t.Errorf("%s = %v during the fault, want %v", fileChanges(change), got, want)
				}
			}

			tt.repair(t, e)
			eventually(t, 10*time.Second, "the records published during the fault, after the repair", func() bool {
				d := e.payloadsDelivered()
				return d["during-1"] >= 1 && d["during-2"] >= 1
			})
			publishTo(t, e.stream, "after-1")
			eventually(t, 10*time.Second, "a record published after the repair", func() bool { return e.payloadsDelivered()["after-1"] >= 1 })
			if log := p.stderr.String(); tt.blocked && !strings.Contains(log, "the file that replaced the stream file can be opened now") &&
				!strings.Contains(log, "the file that could not be opened is gone from the path") {
				t.Errorf("the log does not say the trouble passed")
			}
			eventually(t, 10*time.Second, "the end of the file to be committed", committedAtEnd(e, "billing"))
			if code := p.stop(t); code != 0 {
				t.Fatalf("exit code %d", code)
			}
			want := append(append([]string{"before-1", "before-2", "before-3"}, during...), "after-1")
			got := e.payloadsDelivered()
			for _, w := range want {
				if got[w] != 1 {
					t.Errorf("%s delivered %d times, want once; deliveries %q", w, got[w], e.deliveries())
				}
			}
			if len(got) != len(want) {
				t.Errorf("deliveries %q, want %q each once", e.deliveries(), want)
			}
			pos := storedPosition(t, e, "billing")
			if pos.File.Ino != inode(t, e.stream) || pos.Offset != fileSize(t, e.stream) {
				t.Errorf("stored position %+v, want the end of the file now at the path (ino %d, %d bytes)", pos, inode(t, e.stream), fileSize(t, e.stream))
			}
		})
	}
}

// fileSize returns the size of the file at path.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestFaultUnreadableStreamAtStart starts the daemon (as nobody) on a
// stream file it may not open: the daemon runs on (one broken stream is
// not its failure, Invariant 6), logs an error naming the file, the error
// and the access it needs, and stores no position. Once the file's owner
// is fixed, the subscription starts by itself, without a restart, and
// delivers every record.
func TestFaultUnreadableStreamAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "", ""))
	publishTo(t, e.stream, "r1", "r2")
	bin := asNobody(t, e)
	if err := os.Chown(e.stream, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.stream, 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.startAs(bin, nobody)
	eventually(t, 10*time.Second, "the error about the stream file", func() bool {
		return p.logCount("stream file cannot be read") == 1
	})
	stderr := p.stderr.String()
	if !strings.Contains(stderr, e.stream) || !strings.Contains(stderr, "permission denied") || !strings.Contains(stderr, "level=ERROR") ||
		!strings.Contains(stderr, "needs read and write access") {
		t.Errorf("stderr does not name the file, the error and what the daemon needs:\n%s", stderr)
	}
	if s, err := offsets.Load(e.stateDirPath()); err != nil || len(s) != 0 {
		t.Errorf("positions %v, %v while the file cannot be opened; want none", s, err)
	}

	if err := os.Chown(e.stream, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "both records", func() bool { return len(e.deliveries()) == 2 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); !slices.Equal(got, []string{"1 1 r1", "2 1 r2"}) {
		t.Errorf("deliveries %q", got)
	}
}

// mountCmd runs mount (or umount) with args, failing the test on an error.
func mountCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// remount changes the mount options of the bind mount at dir. The kernel
// refuses to make a mount read-only while a write through it is under way
// (EBUSY), which a commit or even an atime update makes for a moment: it
// tries again for a while.
func remount(t *testing.T, dir, opts string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		out, err := exec.Command("mount", "-o", opts, dir).CombinedOutput()
		if err == nil {
			return
		}
		if !strings.Contains(string(out), "busy") || time.Now().After(deadline) {
			t.Fatalf("mount -o %s %s: %v: %s", opts, dir, err, out)
		}
	}
}

// readOnlyStateSub is the subscription of the state-directory tests: it
// acks every record but those whose payload starts with "later", for which
// its first attempt asks for a retry in an hour (a copy in the spool).
func readOnlyStateSub() string {
	return execSub("billing", `backoff = ["1s"]`, `case $p in later*) [ "$STREAMD_ATTEMPT" = 1 ] && echo retry_after=1h ;; esac; true`)
}

// TestFaultReadOnlyStateDir makes the state directory read-only under the
// running daemon, then writable again, and later stops the daemon while it
// is read-only.
//
// A plain `mount -o remount,ro` of the state directory's filesystem is
// refused by the kernel (EBUSY) while streamd runs: it holds its lock file
// and its retry spool open for writing. What does happen to a running
// daemon is that the directory stops taking new files while the open ones
// stay writable, e.g. a read-only bind mount over it: that is the fault
// made here (`mount --bind` over the directory, `remount,bind,ro`, later
// `remount,bind,rw`). TestFaultStateFilesystemError covers a filesystem the
// kernel turns read-only under open files.
//
// While read-only: the daemon keeps running and delivering, and delayed
// copies are still spooled (through the open spool); each commit fails
// and is counted (streamd_offset_commits_total{result="failure"}), and the
// sidecar keeps the last good commit. Once writable, commits resume by
// themselves. Stopped while read-only, the daemon logs that its final
// commit failed, naming the sidecar, and a restart resumes from the last
// good commit: the records settled since are delivered again (at least
// once), none is lost, and the spooled copies are still there.
func TestFaultReadOnlyStateDir(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("bind-mounting over the state directory needs root")
	}
	e := newEnv(t, readOnlyStateSub())
	addr := e.withMetrics()
	state := e.stateDirPath()
	os.Mkdir(state, 0o755)
	e.publish("a1", "later-1")
	p := e.start()
	committed := func(seq uint64) func() bool { return committedThrough(state, "billing", seq) }
	eventually(t, 10*time.Second, "a1 and later-1 to be committed", committed(2))

	// Read-only under the running daemon.
	if out, err := exec.Command("mount", "--bind", state, state).CombinedOutput(); err != nil {
		t.Skipf("cannot bind-mount here (%v: %s)", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("umount", "-l", state).Run() })
	remount(t, state, "remount,bind,ro")
	if err := os.WriteFile(filepath.Join(state, "probe"), nil, 0o644); err == nil || !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("writing into the state directory: %v, want a read-only file system", err)
	}
	failures := func() float64 { return metricValue(t, addr, `streamd_offset_commits_total{result="failure"}`) }
	e.publish("a2", "later-2", "a3")
	eventually(t, 10*time.Second, "a2, later-2 and a3 to be delivered", func() bool { return len(e.deliveries()) == 5 })
	eventually(t, 5*time.Second, "later-2's copy to be spooled", func() bool {
		return scrapeMetric(t, addr, "streamd_retries_scheduled_total", "billing") == 2
	})
	// Counted, one per commit_interval: the count goes on growing, four
	// more at least, so that the spell is long enough for the rate limit
	// of their log line to show (see the subtest at the end).
	eventually(t, 5*time.Second, "a failed commit to be counted", func() bool { return failures() >= 1 })
	f1 := failures()
	eventually(t, 5*time.Second, "four more failed commits", func() bool { return failures() >= f1+4 })
	if s, err := offsets.Load(state); err != nil || s["billing"].LastSeq != 2 {
		t.Errorf("sidecar %+v, %v while read-only; want the last good commit (seq 2)", s["billing"], err)
	}
	select {
	case <-p.done:
		t.Fatalf("the daemon exited: %s", p.cmd.ProcessState)
	default:
	}

	// Writable again: commits resume by themselves.
	remount(t, state, "remount,bind,rw")
	eventually(t, 5*time.Second, "the positions to be committed after the remount", committed(5))
	// The sidecar is visible at its rename; the commit is counted after
	// the directory's fsync. Take the count once it has settled.
	var okCommits float64
	eventually(t, 5*time.Second, "the successful commits to settle", func() bool {
		before := metricValue(t, addr, `streamd_offset_commits_total{result="success"}`)
		time.Sleep(300 * time.Millisecond) // three commit intervals
		okCommits = metricValue(t, addr, `streamd_offset_commits_total{result="success"}`)
		return okCommits == before
	})

	// Stopped while read-only: the final commit fails, and says so.
	remount(t, state, "remount,bind,ro")
	f2 := failures()
	e.publish("a4")
	eventually(t, 10*time.Second, "a4 to be delivered", func() bool { return len(e.deliveries()) == 6 })
	// A commit of a4's position was tried since: it failed.
	eventually(t, 5*time.Second, "a failed commit after a4", func() bool { return failures() > f2 })
	if got := metricValue(t, addr, `streamd_offset_commits_total{result="success"}`); got != okCommits {
		t.Errorf("%v successful commits while read-only", got-okCommits)
	}
	if code := p.stop(t); code != 1 {
		t.Errorf("exit code %d after a stop whose final commit failed, want 1", code)
	}
	roLog := p.stderr.String()
	final := slogRecords(roLog, "final commit of positions failed")
	if len(final) != 1 || !strings.Contains(final[0]["err"], filepath.Join(state, offsets.SidecarName)) ||
		!strings.Contains(final[0]["err"], "read-only file system") {
		t.Errorf("final commit log %v: want one line naming the sidecar and the read-only file system", final)
	}
	// The restart resumes after a3, the last good commit.
	mountCmd(t, "umount", state)
	if s, err := offsets.Load(state); err != nil || s["billing"].LastSeq != 5 {
		t.Fatalf("sidecar %+v, %v after the stop; want the last good commit (seq 5)", s["billing"], err)
	}
	if n := spoolPending(t, state); n != 2 {
		t.Errorf("%d copies in the spool, want later-1's and later-2's", n)
	}
	p = e.start()
	eventually(t, 10*time.Second, "a4 to be delivered again and committed", committed(6))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	want := []string{"1 1 a1", "2 1 later-1", "3 1 a2", "4 1 later-2", "5 1 a3", "6 1 a4", "6 1 a4"}
	if got := e.deliveries(); !slices.Equal(got, want) {
		t.Errorf("deliveries %q, want %q: each record once, and a4, settled after the last good commit, again", got, want)
	}

	t.Run("failed commits are logged", func(t *testing.T) {
		// About 50 commits failed, 100 ms apart, in two spells a few
		// seconds apart: logged at once, then at most every 10 s (the
		// second spell too), and the end of the first once.
		failed := slogRecords(roLog, "committing positions failed")
		if len(failed) < 1 || len(failed) > 3 || !strings.Contains(failed[0]["err"], filepath.Join(state, offsets.SidecarName)) {
			t.Errorf("log lines of failed commits %v: want one, or a few, naming the sidecar", failed)
		}
		if again := slogRecords(roLog, "committing positions works again"); len(again) != 1 {
			t.Errorf("log lines of commits working again %v: want one, after the first spell", again)
		}
	})
}

// TestFaultStateFilesystemError turns the state directory's filesystem
// read-only the way the kernel does it under open files: an ext4 error
// with errors=remount-ro (ext4's trigger_fs_error), after which every
// write fails, through open descriptors too, and only an unmount, fsck and
// mount bring the filesystem back. The retry spool fails as well as the
// commits.
//
// A record whose delayed copy cannot be spooled stays unsettled, and a
// spool that cannot undo its partial write is dead: the daemon stops with
// exit 1 (systemd restarts it) instead of running on without it, logging
// the failed spool and the failed final commit, naming both files. After
// fsck and mount, a restart resumes from the last good commit: every record
// is delivered at least once, the unsettled one again (its copy spooled
// this time), and the copy spooled before the error is still pending.
func TestFaultStateFilesystemError(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting an ext4 image needs root")
	}
	for _, tool := range []string{"mkfs.ext4", "e2fsck", "findmnt"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here: %v", tool, err)
		}
	}
	e := newEnv(t, readOnlyStateSub())
	e.editConfig(`shutdown_timeout = "5s"`, `shutdown_timeout = "1s"`)
	e.withMetrics()
	state := e.stateDirPath()
	img := filepath.Join(e.dir, "state.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	mountCmd(t, "mkfs.ext4", "-q", "-F", img)
	os.Mkdir(state, 0o755)
	mountImage := func() {
		if out, err := exec.Command("mount", "-o", "loop,errors=remount-ro", img, state).CombinedOutput(); err != nil {
			t.Skipf("cannot loop-mount an ext4 image here (%v: %s)", err, strings.TrimSpace(string(out)))
		}
	}
	mountImage()
	t.Cleanup(func() { exec.Command("umount", "-l", state).Run() })
	e.publish("a1", "later-1")
	p := e.start()
	committed := func(seq uint64) func() bool { return committedThrough(state, "billing", seq) }
	eventually(t, 10*time.Second, "a1 and later-1 to be committed", committed(2))

	// The filesystem fails under the running daemon.
	src, err := exec.Command("findmnt", "-n", "-o", "SOURCE", state).Output()
	if err != nil {
		t.Fatalf("findmnt: %v", err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(strings.TrimSpace(string(src))), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("1"), 0); err != nil {
		t.Skipf("cannot trigger an ext4 error here: %v", err)
	}
	if err := os.WriteFile(filepath.Join(state, "probe"), nil, 0o644); err == nil {
		t.Fatal("the state directory still takes writes after the ext4 error")
	}
	e.publish("a2", "later-2", "a3")

	// The spool cannot take later-2's copy, nor undo the partial write: the
	// daemon stops with exit 1 (systemd restarts it) rather than run on with
	// a dead spool. later-2 stays unsettled; the sidecar keeps the last good
	// commit; the final commit fails and says so.
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("the daemon still runs with a failed spool; log:\n%s", p.stderr.String())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	log := p.stderr.String()
	if spool := slogRecords(log, "retry spool failed"); len(spool) != 1 || !strings.Contains(spool[0]["err"], "retry.spool") {
		t.Errorf("log lines of the failed spool %v: want one naming the spool", spool)
	}
	if final := slogRecords(log, "final commit of positions failed"); len(final) != 1 ||
		!strings.Contains(final[0]["err"], filepath.Join(state, offsets.SidecarName)) {
		t.Errorf("final commit log %v: want one line naming the sidecar", final)
	}
	if got := e.deliveries(); !slices.Equal(got, []string{"1 1 a1", "2 1 later-1", "3 1 a2", "4 1 later-2"}) {
		t.Errorf("deliveries %q: want a2 and later-2, and a3 waiting behind later-2", got)
	}

	// Repair the filesystem; restart.
	mountCmd(t, "umount", state)
	if out, err := exec.Command("e2fsck", "-f", "-y", img).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() >= 4 {
			t.Fatalf("e2fsck: %v: %s", err, out)
		}
	}
	mountImage()
	if s, err := offsets.Load(state); err != nil || s["billing"].LastSeq != 2 {
		t.Fatalf("sidecar %+v, %v after the repair; want the last good commit (seq 2)", s["billing"], err)
	}
	p = e.start()
	eventually(t, 10*time.Second, "everything to be delivered and committed", committed(5))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	want := []string{"1 1 a1", "2 1 later-1", "3 1 a2", "4 1 later-2", "3 1 a2", "4 1 later-2", "5 1 a3"}
	if got := e.deliveries(); !slices.Equal(got, want) {
		t.Errorf("deliveries %q, want %q", got, want)
	}
	if n := spoolPending(t, state); n != 2 {
		t.Errorf("%d copies in the spool, want later-1's and later-2's", n)
	}
}

// processGone polls until pid is gone or within is over. A zombie counts
// as gone: it is dead and only waits for a parent that may never reap it
// (the container's init).
func processGone(pid int, within time.Duration) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			return true
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestFaultHungHandler gives the daemon a handler that never answers the
// first delivery of record "hang": an exec handler that sleeps forever,
// alone or with children in its process group, and an http handler whose
// server never answers. At the handler's timeout (2s, for the hung exec
// handler to have started its children by then on a busy machine too) the
// delivery ends as DESIGN.md says: the exec handler's whole process group
// is killed (no process is left), the delivery failed, counted in
// streamd_handler_failed_deliveries_total{reason="timeout"} and logged with
// the timeout, and the record is held and delivered again in place after
// the backoff step (no copy), which the handler acks this time. The
// records after it flow on, and the stored position ends at the end of the
// file.
func TestFaultHungHandler(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	sub := func(kind, handler string) string {
		return fmt.Sprintf(`
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
backoff = ["200ms"]
[subscription.handler]
kind = %q
timeout = %q
%s
`, kind, timeout, handler)
	}
	shell := func(script string) func(t *testing.T, dir string) string {
		return func(t *testing.T, dir string) string {
			return sub("exec", fmt.Sprintf(`command = ["/bin/sh", "-c", '''IFS= read -r p; echo "$STREAMD_SEQ $STREAMD_ATTEMPT $p" >> LOG
if [ "$p" = hang ] && [ ! -e %[1]s/hung ]; then touch %[1]s/hung; cd %[1]s; %[2]s; fi''']`, dir, script))
		}
	}
	tests := []struct {
		name string
		// handler returns the subscription's TOML; dir is the test's.
		handler func(t *testing.T, dir string) string
		err     string // of the failed outcome
		pids    int    // processes the hung exec handler wrote to pid.N
	}{
		{
			name:    "exec sleeps forever",
			handler: shell(`echo $$ > pid.0; exec sleep 1000`),
			err:     "exec /bin/sh: timed out after 2s",
			pids:    1,
		},
		{
			name: "exec with children in its process group",
			handler: shell(`echo $$ > pid.0; sleep 1000 & echo $! > pid.1; (sleep 1000; true) & echo $! > pid.2
wait`),
			err:  "exec /bin/sh: timed out after 2s",
			pids: 3,
		},
		{
			name: "http server never answers",
			handler: func(t *testing.T, dir string) string {
				log := filepath.Join(dir, "deliveries.log")
				var mu sync.Mutex
				hung := false
				release := make(chan struct{})
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					body, _ := io.ReadAll(r.Body)
					attempt := r.Header.Get("Streamd-Attempt")
					mu.Lock()
					f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
					if err == nil {
						fmt.Fprintf(f, "%s %s %s\n", r.Header.Get("Streamd-Seq"), attempt, body)
						f.Close()
					}
					mu.Unlock()
					mu.Lock()
					first := string(body) == "hang" && !hung
					hung = hung || first
					mu.Unlock()
					if first {
						select { // never answers; ends when the client goes
						case <-r.Context().Done():
						case <-release:
						}
						return
					}
					w.WriteHeader(http.StatusNoContent)
				}))
				t.Cleanup(srv.Close)
				t.Cleanup(func() { close(release) })
				return sub("http", fmt.Sprintf("url = %q", srv.URL))
			},
			err: "http: timed out after 2s",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "")
			e.writeConfig(tt.handler(t, e.dir))
			addr := e.withMetrics()
			e.publish("hang", "ok-1", "ok-2")
			p := e.start()
			eventually(t, 10*time.Second, "hang again, then ok-1 and ok-2", func() bool {
				d := e.deliveries()
				return slices.Contains(d, "2 1 ok-1") && slices.Contains(d, "3 1 ok-2")
			})
			eventually(t, 5*time.Second, "the position to be committed after ok-2", func() bool {
				s, err := offsets.Load(e.stateDirPath())
				return err == nil && s["billing"].LastSeq == 3
			})
			if got := e.deliveries(); !slices.Equal(got, []string{"1 1 hang", "1 1 hang", "2 1 ok-1", "3 1 ok-2"}) {
				t.Errorf("deliveries %q: want hang twice (held, delivered again in place), then ok-1 and ok-2", got)
			}
			if got := metricValue(t, addr, `streamd_handler_failed_deliveries_total{reason="timeout",subscription="billing"}`); got != 1 {
				t.Errorf("%v failed deliveries counted, want 1", got)
			}
			failed := slogRecords(p.stderr.String(), "delivery failed; holding the record and delivering it again in place until the handler answers")
			if len(failed) != 1 || failed[0]["err"] != tt.err || failed[0]["seq"] != "1" || failed[0]["retry_in"] != "200ms" || failed[0]["reason"] != "timeout" {
				t.Errorf("log lines %v: want one for seq 1 with %q, reason timeout and retry_in 200ms", failed, tt.err)
			}
			if orders := e.framesOf("orders"); len(orders) != 3 {
				t.Errorf("records under orders %+v: want the three, no copy", orders)
			}
			for i := range tt.pids {
				b, err := os.ReadFile(filepath.Join(e.dir, fmt.Sprintf("pid.%d", i)))
				if err != nil {
					t.Fatal(err)
				}
				pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
				if err != nil {
					t.Fatal(err)
				}
				if !processGone(pid, time.Second) {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Errorf("process %d (pid.%d) of the hung handler is still running", pid, i)
				}
			}
			if code := p.stop(t); code != 0 {
				t.Fatalf("exit code %d", code)
			}
		})
	}
}

// TestFaultReplacedStreamCopies replaces the stream file under a running
// daemon (as nobody) with a file it may read but not write, holding a
// record whose handler asks for an immediate retry. The copy must go to
// the file now at the path, which the daemon reads, not to the old file
// it still holds open (where nobody would read it again): while the new
// file cannot be opened for appending, the copy fails (counted in
// streamd_copy_errors_total, logged with the path), the record stays
// unsettled, and no copy lands in the old file; once the file is writable
// the copy is appended to it and delivered.
func TestFaultReplacedStreamCopies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", `backoff = ["200ms"]`, `case $p in retry*) [ "$STREAMD_ATTEMPT" = 1 ] && echo retry_after=0s ;; esac; true`))
	addr := e.withMetrics()
	publishTo(t, e.stream, "retry-a")
	bin := asNobody(t, e)
	p := e.startAs(bin, nobody)
	eventually(t, 10*time.Second, "retry-a and its copy", func() bool { return e.payloadsDelivered()["retry-a"] == 2 })

	old := e.stream + ".old"
	if err := os.Link(e.stream, old); err != nil { // keeps the old file in view
		t.Fatal(err)
	}
	tmp := e.stream + ".new"
	publishTo(t, tmp, "retry-b") // root's, 0644: readable, not writable, by nobody
	if err := os.Rename(tmp, e.stream); err != nil {
		t.Fatal(err)
	}
	// A few tries, a backoff (200ms) apart.
	eventually(t, 10*time.Second, "retry-b's copy to fail three times", func() bool {
		return scrapeMetric(t, addr, "streamd_copy_errors_total", "billing") >= 3
	})
	if n := countCopies(t, old); n != 1 {
		t.Errorf("%d copies in the old file, want retry-a's only", n)
	}
	if d := e.payloadsDelivered(); d["retry-b"] != 1 {
		t.Errorf("retry-b delivered %d times while its copy cannot be written, want once", d["retry-b"])
	}
	lines := slogRecords(p.stderr.String(), "publishing the copy failed; the record stays unsettled")
	if len(lines) == 0 || !strings.Contains(lines[0]["err"], e.stream) || !strings.Contains(lines[0]["err"], "permission denied") {
		t.Errorf("log lines %v: want the failed copy logged with the path and the error", lines)
	}
	if pos := storedPosition(t, e, "billing"); pos.File.Ino == inode(t, e.stream) && pos.LastSeq >= 1 {
		t.Errorf("stored position %+v is past retry-b, whose copy was not written", pos)
	}

	if err := os.Chown(e.stream, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "retry-b's copy, delivered", func() bool { return e.payloadsDelivered()["retry-b"] == 2 })
	if n := countCopies(t, e.stream); n != 1 {
		t.Errorf("%d copies in the new file, want retry-b's", n)
	}
	if n := countCopies(t, old); n != 1 {
		t.Errorf("%d copies in the old file, want retry-a's only", n)
	}
	eventually(t, 10*time.Second, "the end of the new file to be committed", committedAtEnd(e, "billing"))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if pos := storedPosition(t, e, "billing"); pos.File.Ino != inode(t, e.stream) || pos.Offset != fileSize(t, e.stream) {
		t.Errorf("stored position %+v, want the end of the new file", pos)
	}
}
