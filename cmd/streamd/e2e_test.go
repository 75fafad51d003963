package main

import (
	"bytes"
	"flag"
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
		out, err := exec.Command("go", "build", "-race", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = &buildError{err, out}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + string(e.out) }

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
