package offsets

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/streamd/streamd/internal/durable"
)

// LockName is the name of the lock file in the state directory.
const LockName = "lock"

// LockedError reports that another process, or another [Store] in this
// process, holds the lock of a state directory.
type LockedError struct {
	// Path is the lock file.
	Path string
	// PID is the process ID the holder wrote into the lock file, or 0 if
	// it could not be read.
	PID int
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("offsets: %s holds %s; only one streamd may use a state directory at a time", e.holder(), e.Path)
}

// holder names the process that holds the lock.
func (e *LockedError) holder() string {
	if e.PID > 0 {
		return fmt.Sprintf("another streamd (pid %d)", e.PID)
	}
	return "another streamd"
}

// takenError is a lock file removed while this streamd ran, which another
// streamd made again and holds (or held): the state directory is no longer
// this one's.
type takenError struct{ locked *LockedError }

func (e *takenError) Error() string {
	return fmt.Sprintf("offsets: the lock file %s was removed while this streamd ran, and %s made another: only one streamd may use a state directory at a time, and this one commits no position until it is restarted; stop one of them (both deliver the records)", e.locked.Path, e.locked.holder())
}

func (e *takenError) Unwrap() error { return e.locked }

// lockOrphanWait is how long acquireLock waits for a lock whose holder's
// process has gone (see there).
const lockOrphanWait = 2 * time.Second

// running reports whether process pid exists (0: no process named).
func running(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// euid is the effective user ID of the process; a test makes it root's.
var euid = os.Geteuid

// CheckOwner refuses root (uid 0) a state directory another user owns:
// the files it would create there (the lock, the sidecar, the retry spool)
// would be root's, and the daemon, running as the directory's owner, could
// not open them at its next start. A missing directory passes: the lock's
// open says so. The lock checks it for this process; streamd check-config
// for the daemon's user.
func CheckOwner(dir string, uid int) error {
	fi, err := os.Stat(dir)
	if uid != 0 || err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	owner := strconv.FormatUint(uint64(st.Uid), 10)
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	return fmt.Errorf("offsets: state directory %s belongs to user %s, and streamd would run as root: "+
		"the files it would create there (lock, %s, retry.spool) would be root's, and a streamd running as %s could not open them; "+
		"run it as that user (sudo -u %s streamd ...), or chown the directory to root if root runs the daemon", dir, owner, SidecarName, owner, owner)
}

// lockFile is a held flock(2) on a state directory's lock file.
type lockFile struct {
	f    *os.File
	path string
	// noPID: the PID could not be written for want of space; the Store
	// tries again at each commit (each commit_interval).
	noPID bool
}

// acquireLock takes an exclusive, non-blocking flock on dir/lock and writes
// this process's PID into the file. flock locks belong to the open file
// description, so a second acquireLock in the same process conflicts too,
// and the kernel drops the lock when the process dies. os.OpenFile sets
// O_CLOEXEC, so child processes (exec handlers) never inherit it.
func acquireLock(dir string) (*lockFile, error) {
	if err := CheckOwner(dir, euid()); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("offsets: lock: %w", err)
	}
	ok, err := durable.TryLock(f.Fd(), durable.Exclusive)
	// A streamd killed while it started an exec handler leaves the child
	// between fork and exec sharing the lock for a moment, until the
	// parent-death signal ends it: when the PID in the file is a process
	// that has gone, wait for the lock a little.
	for deadline := time.Now().Add(lockOrphanWait); err == nil && !ok && !running(readPID(f)) && time.Now().Before(deadline); {
		time.Sleep(lockOrphanWait / 100)
		ok, err = durable.TryLock(f.Fd(), durable.Exclusive)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("offsets: lock %s: %w", path, err), f.Close())
	}
	if !ok {
		locked := &LockedError{Path: path, PID: readPID(f)}
		if closeErr := f.Close(); closeErr != nil {
			return nil, errors.Join(locked, closeErr)
		}
		return nil, locked
	}
	if err := writePID(f); err != nil {
		// A full state disk must not keep the daemon from starting: it
		// reads and settles records meanwhile, and commits once there is
		// room. Only streamd reload, which reads the PID, waits for it.
		if durable.NoSpace(err) {
			return &lockFile{f: f, path: path, noPID: true}, nil
		}
		return nil, errors.Join(fmt.Errorf("offsets: lock: %w", err), f.Close())
	}
	return &lockFile{f: f, path: path}, nil
}

// reclaim makes the lock file again, and locks it, when it was removed
// while the daemon runs (a state directory cleaned by hand), and reports
// whether it had to: without it another streamd could lock a new one and
// use the directory too. A lock file at the path that is not the one held
// is another streamd's, which took the directory: an error, and nothing is
// taken from it.
func (l *lockFile) reclaim() (bool, error) {
	held, err := l.f.Stat()
	if err != nil {
		return false, fmt.Errorf("offsets: lock: %w", err)
	}
	fi, err := os.Stat(l.path)
	switch {
	case err == nil && os.SameFile(fi, held):
		return false, nil
	case err == nil:
		return false, l.taken()
	case !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("offsets: lock: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, fs.ErrExist) {
		return false, l.taken()
	}
	if err != nil {
		return false, fmt.Errorf("offsets: the lock file %s was removed while streamd ran, and cannot be made again: %w", l.path, err)
	}
	if ok, err := durable.TryLock(f.Fd(), durable.Exclusive); err != nil || !ok {
		f.Close()
		if err != nil {
			os.Remove(l.path) // made here, unlocked: the next commit makes it again
			return false, fmt.Errorf("offsets: lock %s: %w", l.path, err)
		}
		return false, l.taken()
	}
	old := l.f
	l.f, l.noPID = f, true // the PID is written next (writeMissingPID)
	return true, old.Close()
}

// taken is the error of a lock file that another streamd made after the
// one held was removed.
func (l *lockFile) taken() error {
	pid := 0
	if f, err := os.Open(l.path); err == nil {
		pid = readPID(f)
		f.Close()
	}
	return &takenError{&LockedError{Path: l.path, PID: pid}}
}

// writeMissingPID writes the PID that acquireLock could not write, if
// there is room now.
func (l *lockFile) writeMissingPID() {
	if l.noPID && writePID(l.f) == nil {
		l.noPID = false
	}
}

// release empties the lock file, so that nobody reads a stale PID from it,
// and closes it, which drops the lock.
func (l *lockFile) release() error {
	var errs []error
	if err := l.f.Truncate(0); err != nil {
		errs = append(errs, fmt.Errorf("offsets: unlock: %w", err))
	}
	if err := l.f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("offsets: unlock: %w", err))
	}
	return errors.Join(errs...)
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// readPID returns the PID a lock holder wrote into f, or 0. The holder may
// be between taking the lock and writing its PID, so a missing or partial
// number is not an error.
func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// LockHolder returns the PID of the streamd that holds the lock of the
// state directory dir: the PID its lock file records, checked to be a
// process that has the lock file open, so that a PID left by a streamd
// that died (and since reused) is never taken for it. It takes no lock and
// writes nothing. It needs to read /proc/PID/fd: run it as the daemon's
// user or root.
func LockHolder(dir string) (int, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("no streamd runs on state directory %s: %w", dir, err)
	}
	defer f.Close()
	pid := readPID(f)
	if pid == 0 {
		return 0, fmt.Errorf("no streamd runs on state directory %s: its lock file names no process: none runs, as a stopped streamd leaves it (or one that started on a full disk runs and writes its PID there at its first commit with room on the disk)", dir)
	}
	lock, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("offsets: %w", err)
	}
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fds)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("no streamd runs on state directory %s: process %d, which %s names, is gone", dir, pid, path)
	}
	if err != nil {
		return 0, fmt.Errorf("cannot check that process %d holds %s (run as the daemon's user or root): %w", pid, path, err)
	}
	for _, e := range entries {
		if fi, err := os.Stat(filepath.Join(fds, e.Name())); err == nil && os.SameFile(fi, lock) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no streamd runs on state directory %s: process %d, which %s names, does not hold it", dir, pid, path)
}
