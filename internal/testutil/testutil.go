// Package testutil holds what the tests of several packages share: a
// buffer a process or goroutine writes while the test reads it, a full
// disk made with RLIMIT_FSIZE, a socket standing in for systemd's notify
// socket, and the switch to the sizes of the acceptance figures. Only
// _test.go files import it.
package testutil

import (
	"bytes"
	"flag"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// LargeEnv is the environment variable that, set to 1, gives the tests
// and benchmarks that measure an acceptance figure the sizes the figure
// names (1 GB and 2 GB files; 100 000 records forwarded, 20 kills, a 20 s
// outage) instead of the smaller ones that keep make test fast.
const LargeEnv = "STREAMD_LARGE_TESTS"

// Large reports whether LargeEnv is set to 1.
func Large() bool { return os.Getenv(LargeEnv) == "1" }

// SyncBuffer is a bytes.Buffer safe for a writer on another goroutine (a
// logger, a child process's output) while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// InOwnProcess runs the calling test again in a process of its own when
// the go command keeps a log of what the test process opens (for its test
// cache: go test without -count=1), and reports whether the caller is to
// run the test: true in that process, or when there is no such log; false
// in the test process, which returns at once (the other process's failure
// is its own). A test that limits the file size of the process
// (LimitFileSize) needs it: the limit would make writing that log fail.
func InOwnProcess(t *testing.T) bool {
	t.Helper()
	if !testLogged() {
		return true
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.count=1", "-test.v")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s, run again in a process of its own (the go command logs what this one opens): %v\n%s", t.Name(), err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name()+" ")) {
		t.Fatalf("%s did not run in its own process:\n%s", t.Name(), out)
	}
	return false
}

// testLogged reports whether the go command has the test process log what
// it opens (the test.testlogfile flag).
func testLogged() bool {
	f := flag.Lookup("test.testlogfile")
	return f != nil && f.Value.String() != ""
}

// LimitFileSize makes every write of the process at or past offset n of a
// file fail with EFBIG (RLIMIT_FSIZE), as a full disk does: a write that
// crosses n writes the bytes before it. The limit holds until lift is
// called or the test ends; a test that sets it must not be parallel, and
// begins with InOwnProcess.
func LimitFileSize(t testing.TB, n uint64) (lift func()) {
	t.Helper()
	if testLogged() {
		t.Fatal("LimitFileSize would make the go command's test log fail: call InOwnProcess first")
	}
	signal.Ignore(syscall.SIGXFSZ) // a write past the limit fails with EFBIG instead
	var unlimited syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &unlimited); err != nil {
		t.Fatal(err)
	}
	limit := syscall.Rlimit{Cur: n, Max: unlimited.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Fatal(err)
	}
	lift = func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &unlimited); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(lift)
	return lift
}

// ListenNotify listens on a unixgram socket in a temporary directory, as
// systemd's notify socket does, until the test ends. The test gives path
// to the daemon as $NOTIFY_SOCKET.
func ListenNotify(t testing.TB) (conn *net.UnixConn, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, path
}
