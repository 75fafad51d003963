package offsets

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// Tests that need a second process run the test binary again with
// helperEnv set to a mode; TestHelperProcess then plays that part.
const (
	helperEnv    = "OFFSETS_TEST_HELPER"
	helperDirEnv = "OFFSETS_TEST_DIR"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestHelperProcess is not a test: it is the second process of the tests
// that start one, and does nothing unless helperEnv is set.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	dir := os.Getenv(helperDirEnv)
	var err error
	switch mode {
	case "hold":
		err = helperHold(dir)
	case "crash":
		err = helperCrash(dir)
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// helperCommand returns the command that runs TestHelperProcess in mode on
// the state directory dir.
func helperCommand(mode, dir string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperDirEnv+"="+dir,
		// Under -race, a process sleeps a second at exit by default.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// helperHold opens the store in dir, prints "locked", and holds the lock
// until its standard input ends.
func helperHold(dir string) error {
	s, err := Open(dir, Options{})
	if err != nil {
		return err
	}
	if _, err := fmt.Println("locked"); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, bufio.NewReader(os.Stdin)); err != nil {
		return err
	}
	return s.Close()
}
