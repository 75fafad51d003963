package offsets

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLockHolder: the holder is the process that has the lock file open
// and whose PID it records; a stale PID, an empty or a missing lock file
// name no holder.
func TestLockHolder(t *testing.T) {
	dir := t.TempDir()
	if _, err := LockHolder(dir); err == nil || !strings.Contains(err.Error(), "no streamd runs on state directory "+dir) {
		t.Errorf("no lock file: %v", err)
	}
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if pid, err := LockHolder(dir); err != nil || pid != os.Getpid() {
		t.Errorf("held: pid %d, %v; want %d", pid, err, os.Getpid())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := LockHolder(dir); err == nil || !strings.Contains(err.Error(), "its lock file names no process") {
		t.Errorf("released: %v", err)
	}
	// A PID left behind, of a process that does not hold the file.
	os.WriteFile(filepath.Join(dir, LockName), []byte(strconv.Itoa(os.Getppid())+"\n"), 0o644)
	if _, err := LockHolder(dir); err == nil || !strings.Contains(err.Error(), "does not hold it") {
		t.Errorf("stale pid: %v", err)
	}
}
