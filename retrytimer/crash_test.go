package retrytimer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/failpoint"
)

// Environment of the helper process of TestCrashRecovery.
const (
	envCrashDir = "STREAMD_RETRYTIMER_CRASH_DIR"
	envCrashN   = "STREAMD_RETRYTIMER_CRASH_N"
)

// Files in the crash test's directory, besides the spool directory.
const (
	crashAcks  = "acked" // one copy number per line, written after Schedule returned
	crashFired = "fired" // "number due_ns fired_ns" per Fire
	crashSpool = "spool" // the spool directory
	crashMin   = 4 << 10 // CompactMinBytes of the helper
)

// TestCrashRecovery kills a process that schedules and fires copies at
// random points, restarts it until every copy has fired, and checks that
// every acknowledged copy fired, none before its due time, and that the
// spool is compacted at the end. Every other run is not killed from outside
// but arms the failpoint retrytimer.spool, so that it kills itself in the
// middle of a spool append, leaving a torn record.
func TestCrashRecovery(t *testing.T) {
	n, kills := 10000, 12
	if testing.Short() {
		n, kills = 1000, 4
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, crashSpool), 0o700); err != nil {
		t.Fatal(err)
	}
	killed, torn := 0, 0
	for run := 1; ; run++ {
		if run > kills+3 {
			t.Fatalf("helper still not done after %d runs", run-1)
		}
		var out bytes.Buffer
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), envCrashDir+"="+dir, envCrashN+"="+strconv.Itoa(n))
		armed := killed < kills && run%2 == 0
		if armed {
			cmd.Env = append(cmd.Env, failpoint.EnvVar+"="+failpoint.RetrytimerSpool+"="+strconv.Itoa(1+rand.IntN(400)))
		}
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		if killed < kills && !armed {
			select {
			case err = <-exited:
			case <-time.After(time.Duration(rand.Int64N(int64(600 * time.Millisecond)))):
				// The helper may have finished meanwhile (Wait reaped it):
				// its exit is then taken as it came.
				if kerr := cmd.Process.Signal(syscall.SIGKILL); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
					t.Fatal(kerr)
				}
				err = <-exited
			}
		} else {
			err = <-exited
		}
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
			killed++
			how := "killed"
			if armed {
				if !strings.Contains(out.String(), "failpoint: "+failpoint.RetrytimerSpool+": hit") {
					t.Fatalf("run %d died of SIGKILL without its failpoint's line:\n%s", run, out.Bytes())
				}
				how = "killed itself in a spool append"
				torn++
			}
			dropTornLine(t, filepath.Join(dir, crashAcks))
			dropTornLine(t, filepath.Join(dir, crashFired))
			t.Logf("run %d %s: %d acknowledged, %d fired so far", run, how,
				lineCount(t, filepath.Join(dir, crashAcks)), lineCount(t, filepath.Join(dir, crashFired)))
			continue
		}
		if err != nil {
			t.Fatalf("helper run %d: %v\n%s", run, err, out.Bytes())
		}
		t.Logf("helper finished in run %d, after %d kills", run, killed)
		break
	}

	// wallClockSteps bounds the backward steps of the wall clock the audit
	// allows for.
	const wallClockSteps = 20 * time.Millisecond
	acked := make(map[int]bool)
	for _, f := range readLines(t, filepath.Join(dir, crashAcks)) {
		i, err := strconv.Atoi(f[0])
		if err != nil || len(f) != 1 {
			t.Fatalf("ack line %q", f)
		}
		acked[i] = true
	}
	fires := make(map[int]int)
	for _, f := range readLines(t, filepath.Join(dir, crashFired)) {
		if len(f) != 3 {
			t.Fatalf("fired line %q", f)
		}
		i, err1 := strconv.Atoi(f[0])
		due, err2 := strconv.ParseInt(f[1], 10, 64)
		at, err3 := strconv.ParseInt(f[2], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatalf("fired line %q: %v", f, err)
		}
		// Both times are read off the wall clock, which may step back
		// (a virtual machine's clock being corrected): the queue then makes
		// pending copies due their delay from the new time, earlier by the
		// wall clock than the due time they carry. A copy fired at its
		// schedule, up to 300 ms early, is still caught.
		if at < due-int64(wallClockSteps) {
			t.Errorf("copy %d fired at %d, %v before its due time", i, at, time.Duration(due-at))
		}
		fires[i]++
	}
	if len(acked) != n {
		t.Errorf("%d copies acknowledged, want %d", len(acked), n)
	}
	var missing []int
	dups := 0
	for i := range acked {
		if fires[i] == 0 {
			missing = append(missing, i)
		}
		dups += max(fires[i]-1, 0)
	}
	if len(missing) > 0 {
		t.Errorf("%d acknowledged copies never fired, e.g. %d", len(missing), missing[0])
	}
	size := fileSize(t, filepath.Join(dir, crashSpool, SpoolName))
	if size > int64(len(fileMagic))+crashMin+200 {
		t.Errorf("spool holds %d bytes with nothing pending, want compacted", size)
	}
	t.Logf("%d copies, %d kills (%d of them torn spool appends), %d fired more than once (at least once), spool %d bytes",
		n, killed, torn, dups, size)
}

// lineCount returns the number of lines in a file, 0 if there is none.
func lineCount(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return bytes.Count(data, []byte("\n"))
}

// dropTornLine cuts the file at path after its last full line. A write
// that SIGKILL interrupts may leave part of its line: the kernel copies a
// write into the page cache a page at a time, and stops between pages for
// a fatal signal. The line of a copy fired (or acknowledged) but torn is
// as if it was never written: the copy was not done firing, and fires
// again; the acknowledgement was not written, and the copy is scheduled
// again.
func dropTornLine(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		if err := os.Truncate(path, int64(bytes.LastIndexByte(data, '\n')+1)); err != nil {
			t.Fatal(err)
		}
	}
}

// readLines returns the fields of each line of a file.
func readLines(t *testing.T, path string) [][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		lines = append(lines, strings.Fields(sc.Text()))
	}
	return lines
}

// TestHelperProcess is the process TestCrashRecovery kills: it schedules
// the copies not yet acknowledged, with delays of 0 to 300 ms, and fires
// every copy in its spool, until none is pending.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(envCrashDir)
	if dir == "" {
		t.Skip("helper process of TestCrashRecovery")
	}
	n, err := strconv.Atoi(os.Getenv(envCrashN))
	if err != nil {
		t.Fatal(err)
	}
	acked := make(map[int]bool)
	if _, err := os.Stat(filepath.Join(dir, crashAcks)); err == nil {
		for _, f := range readLines(t, filepath.Join(dir, crashAcks)) {
			if len(f) != 1 {
				t.Fatalf("ack line %q", f)
			}
			i, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("ack line %q: %v", f, err)
			}
			acked[i] = true
		}
	}
	openAppend := func(name string) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	ackF, firedF := openAppend(crashAcks), openAppend(crashFired)

	// A write is in the page cache when it returns, where SIGKILL cannot
	// undo it: the lines need no fsync. One that SIGKILL interrupts may
	// leave part of its line, which the test cuts (dropTornLine).
	fire := func(_ context.Context, c Copy) error {
		line := fmt.Sprintf("%s %d %d\n", c.Key, dueOf(t, c).UnixNano(), time.Now().UnixNano())
		_, err := firedF.WriteString(line)
		return err
	}
	q, err := Open(Options{Dir: filepath.Join(dir, crashSpool), Fire: fire, CompactMinBytes: crashMin})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()

	todo := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range todo {
				due := time.Now().Add(time.Duration(rand.Int64N(int64(300 * time.Millisecond))))
				if err := q.Schedule(testCopy(strconv.Itoa(i), due, 64), due); err != nil {
					t.Error(err)
					continue
				}
				if _, err := fmt.Fprintf(ackF, "%d\n", i); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for i := range n {
		if !acked[i] {
			todo <- i
		}
	}
	close(todo)
	wg.Wait()

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if abandoned, err := q.Drain(context.Background()); err != nil || abandoned != 0 {
		t.Fatalf("Drain: %d abandoned, %v", abandoned, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}
