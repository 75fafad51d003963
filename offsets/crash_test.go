package offsets

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/failpoint"
	"github.com/streamd/streamd/streamfile"
)

// crashSubscriptions is how many subscriptions the crash helper keeps, so
// that a torn commit would show as entries that disagree.
const crashSubscriptions = 16

// crashPosition is the position the crash helper stores for every
// subscription in its i-th commit.
func crashPosition(i uint64) Position {
	return Position{
		Stream:  "/s/crash.ss",
		File:    streamfile.Identity{Ino: i, FileName: "crash", CreatedAtMs: i},
		Offset:  int64(i) * 100,
		LastSeq: i,
	}
}

func crashName(k int) string { return fmt.Sprintf("sub-%02d", k) }

// helperCrash opens the store in dir and commits increasing positions for
// ever, printing "set i" before it commits i and "ok i" once the commit
// returned. Each line is one write(2), so what the parent reads after
// killing it is exactly what it had printed.
func helperCrash(dir string) error {
	s, err := Open(dir, Options{})
	if err != nil {
		return err
	}
	p, _ := s.Get(crashName(0))
	for i := p.LastSeq + 1; ; i++ {
		for k := range crashSubscriptions {
			if err := s.Set(crashName(k), crashPosition(i)); err != nil {
				return err
			}
		}
		if _, err := fmt.Printf("set %d\n", i); err != nil {
			return err
		}
		if err := s.Commit(); err != nil {
			return err
		}
		if _, err := fmt.Printf("ok %d\n", i); err != nil {
			return err
		}
	}
}

// TestCrash kills a process that commits in a tight loop with SIGKILL at
// random instants, and checks after each kill that the sidecar loads, that
// its subscriptions agree (no commit is half visible), and that it holds
// either the last commit the process saw return or the one it had started:
// never older, never newer, never backwards. One run in four is not killed
// from outside but arms a failpoint (offsets.write: a torn temporary file;
// offsets.commit: a complete one, not renamed) and kills itself in the
// middle of a commit: the sidecar must then hold the last commit that
// returned. Lanes of kills run in parallel, each on a state directory of
// its own, because a killed process dies only once its fsync is done.
//
// STREAMD_TORTURE_KILLS sets the number of kills per lane (make torture
// runs 100; 15 by default, 8 with -short).
func TestCrash(t *testing.T) {
	const lanes = 4
	kills := 15
	if testing.Short() {
		kills = 8
	}
	if s := os.Getenv("STREAMD_TORTURE_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			t.Fatalf("STREAMD_TORTURE_KILLS=%q: want a number of kills", s)
		}
		kills = n
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for lane := range lanes {
		t.Run(fmt.Sprintf("lane%d", lane), func(t *testing.T) {
			t.Parallel()
			crashLane(t, rand.New(rand.NewPCG(seed, uint64(lane))), kills)
		})
	}
}

func crashLane(t *testing.T, rng *rand.Rand, kills int) {
	dir := t.TempDir()
	var stored uint64 // what the sidecar held before this run
	var midCommit, afterRename, failpoints int
	for run := range kills {
		cmd := helperCommand("crash", dir)
		point := ""
		if rng.IntN(4) == 0 {
			point = failpoint.Points[1+rng.IntN(2)] // offsets.write or offsets.commit
			cmd.Env = append(cmd.Env, failpoint.EnvVar+"="+point+"="+strconv.Itoa(1+rng.IntN(20)))
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		out := bufio.NewReader(stdout)
		var lines []string
		// Most runs are killed inside the commit loop; some while they
		// start up, possibly before they open the store.
		if point == "" && rng.IntN(5) > 0 {
			line, err := out.ReadString('\n')
			if err != nil {
				t.Fatalf("run %d: the helper printed nothing: %v\n%s", run, errors.Join(err, cmd.Wait()), stderr.Bytes())
			}
			lines = append(lines, line)
		}
		if point == "" {
			time.Sleep(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		rest, err := io.ReadAll(out)
		if err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("run %d: the helper did not die of SIGKILL: %v\n%s", run, err, stderr.Bytes())
		}
		if point != "" && !strings.Contains(stderr.String(), "failpoint: "+point+": hit") {
			t.Fatalf("run %d: the helper died without its failpoint %s:\n%s", run, point, stderr.Bytes())
		}
		lines = append(lines, strings.SplitAfter(string(rest), "\n")...)

		// The sidecar holds the last commit that returned, or the one
		// after it if the kill came between its rename and the "ok".
		acked, announced := stored, stored
		for _, line := range lines {
			if line == "" {
				continue
			}
			verb, num, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
			i, err := strconv.ParseUint(num, 10, 64)
			if !ok || err != nil || !strings.HasSuffix(line, "\n") {
				// Each line is one write(2): none is cut by the kill.
				t.Fatalf("run %d: unexpected helper output %q", run, line)
			}
			switch verb {
			case "set":
				announced = i
			case "ok":
				acked = i
			default:
				t.Fatalf("run %d: unexpected helper output %q", run, line)
			}
		}
		positions, err := Load(dir)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		now := uint64(0)
		if p, ok := positions[crashName(0)]; ok {
			now = p.LastSeq
		}
		for k := range crashSubscriptions {
			p, ok := positions[crashName(k)]
			if now == 0 && !ok {
				continue
			}
			if !ok || !p.samePlace(crashPosition(now)) {
				t.Fatalf("run %d: torn commit: %s is %+v, %s is at %d", run, crashName(k), p, crashName(0), now)
			}
		}
		if now != acked && now != announced {
			t.Fatalf("run %d: the sidecar holds commit %d; before the run it held %d, the helper last saw commit %d return and had started commit %d",
				run, now, stored, acked, announced)
		}
		if point != "" {
			// Killed before the rename: the commit under way is not visible,
			// and the temporary file it left is.
			if now != acked || announced != acked+1 {
				t.Fatalf("run %d: killed at %s during commit %d, the sidecar holds commit %d, want %d", run, point, announced, now, acked)
			}
			if _, err := os.Stat(filepath.Join(dir, SidecarName+".tmp")); err != nil {
				t.Fatalf("run %d: killed at %s, but no temporary file: %v", run, point, err)
			}
			failpoints++
		}
		if announced > acked {
			if now == announced {
				afterRename++
			} else {
				midCommit++
			}
		}
		stored = now
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	for _, name := range names {
		if !slices.Contains([]string{LockName, SidecarName, SidecarName + ".tmp"}, name) {
			t.Errorf("unexpected file %s in the state directory", filepath.Join(dir, name))
		}
	}
	t.Logf("%d kills (%d of them at a failpoint), %d commits; %d kills inside a commit before its rename, %d between the rename and its return",
		kills, failpoints, stored, midCommit, afterRename)
}
