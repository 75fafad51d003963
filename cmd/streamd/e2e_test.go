package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// e2eRaceEnv, when set to 1 (make test-e2e-race, make torture), has the
// binary the end-to-end tests run built with the race detector: a data race
// in the daemon then ends it with exit status 66 and a report on stderr,
// and the test that ran it fails. Unset, the binary is a plain build, as
// users run it: the test process itself runs under -race either way, and
// the race-built daemon costs a third of this package's CPU, which took
// make test past two minutes on 2 cores.
const e2eRaceEnv = "STREAMD_E2E_RACE"

// streamdBinary builds cmd/streamd once per test run and returns its path.
func streamdBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "streamd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "streamd")
		var flags []string
		switch v := os.Getenv(e2eRaceEnv); v {
		case "", "0":
		case "1":
			flags = append(flags, "-race")
		default:
			buildErr = fmt.Errorf("%s=%q: want 1 (a race-built binary) or 0", e2eRaceEnv, v)
			return
		}
		buildErr = goBuild(binPath, flags...)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// goBuild builds cmd/streamd into out with the extra go build flags.
func goBuild(out string, flags ...string) error {
	args := append(append([]string{"build"}, flags...), "-o", out, ".")
	if b, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, b)
	}
	return nil
}

// e2eParallel is how many tests that call t.Parallel run at once unless
// -test.parallel says otherwise, per core: most of them wait on a daemon and
// its shell handlers, not on the CPU, and GOMAXPROCS alone would leave a
// small machine idle while they wait.
const e2eParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(e2eParallel*runtime.GOMAXPROCS(0)))
	}
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// result is what a run of the binary left.
type result struct {
	stdout, stderr string
	code           int
}

// runBinary runs streamd with args and stdin, and returns its output and
// exit code. It runs in quickExit's environment: the race runtime would
// otherwise sleep a second at each successful exit.
func runBinary(t testing.TB, stdin []byte, args ...string) result {
	t.Helper()
	cmd := exec.Command(streamdBinary(t), args...)
	cmd.Env = quickExit()
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}
