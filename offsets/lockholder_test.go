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

// TestRootRefusedOthersStateDir: root may not open a state directory
// another user owns (the files it would create would be root's, and the
// daemon could not open them at its next start); the directory's owner
// may, and so may root a directory of its own.
func TestRootRefusedOthersStateDir(t *testing.T) {
	dir := t.TempDir()
	if os.Geteuid() == 0 { // as root the directory is root's: give it to nobody
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	defer func(f func() int) { euid = f }(euid)
	euid = func() int { return 0 }
	_, err := Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), "streamd would run as root") || !strings.Contains(err.Error(), "sudo -u ") {
		t.Fatalf("root opening another user's state directory: %v; want a refusal saying how to run it", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the refusal left %d files in the directory", len(entries))
	}

	euid = os.Geteuid
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(dir, Options{}) // the owner, or root on its own directory
	if err != nil {
		t.Fatalf("the directory's owner: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
