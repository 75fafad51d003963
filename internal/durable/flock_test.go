package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openTwice opens one new file twice: two open file descriptions, whose
// flock locks conflict as two processes' would.
func openTwice(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	a, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

func TestTryLock(t *testing.T) {
	for _, tt := range []struct {
		name      string
		held, try LockKind
		granted   bool // while held
	}{
		{"exclusive held, exclusive tried", Exclusive, Exclusive, false},
		{"shared held, exclusive tried", Shared, Exclusive, false},
		{"exclusive held, shared tried", Exclusive, Shared, false},
		{"shared held, shared tried", Shared, Shared, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := openTwice(t)
			if err := Lock(a.Fd(), tt.held); err != nil {
				t.Fatalf("Lock: %v", err)
			}
			if ok, err := TryLock(b.Fd(), tt.try); ok != tt.granted || err != nil {
				t.Fatalf("TryLock while another lock is held: %v, %v; want %v, nil", ok, err, tt.granted)
			}
			if err := Unlock(a.Fd()); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			if ok, err := TryLock(b.Fd(), tt.try); !ok || err != nil {
				t.Fatalf("TryLock after Unlock: %v, %v; want true, nil", ok, err)
			}
		})
	}
}

func TestSharedLocksCoexist(t *testing.T) {
	a, b := openTwice(t)
	if err := Lock(a.Fd(), Shared); err != nil {
		t.Fatal(err)
	}
	if err := Lock(b.Fd(), Shared); err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
}

// TestLockWaits checks that Lock waits while a conflicting lock is held
// and takes the lock once it goes.
func TestLockWaits(t *testing.T) {
	a, b := openTwice(t)
	if err := Lock(a.Fd(), Exclusive); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- Lock(b.Fd(), Shared) }()
	awaitBlockedLock(t, a)
	select {
	case err := <-done:
		t.Fatalf("Lock returned %v while a conflicting lock was held", err)
	default:
	}
	if err := Unlock(a.Fd()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Lock after the holder let go: %v", err)
	}
	if ok, err := TryLock(a.Fd(), Exclusive); ok || err != nil {
		t.Fatalf("TryLock while the shared lock is held: %v, %v; want false, nil", ok, err)
	}
}

// awaitBlockedLock waits until the kernel lists a flock waiter blocked on
// f's file in /proc/locks, where a waiter's line has "->" after its number.
func awaitBlockedLock(t *testing.T, f *os.File) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	// The file column is major:minor:inode, the device in hex.
	suffix := fmt.Sprintf(":%d", st.Ino)
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, err := os.ReadFile("/proc/locks")
		if err != nil {
			t.Skipf("cannot see lock waiters: %v", err)
		}
		for line := range strings.Lines(string(locks)) {
			fields := strings.Fields(line)
			if len(fields) > 6 && fields[1] == "->" && fields[2] == "FLOCK" && strings.HasSuffix(fields[6], suffix) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no waiter blocked on the lock after 10 s; /proc/locks:\n%s", locks)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLockBadDescriptor(t *testing.T) {
	a, _ := openTwice(t)
	fd := a.Fd()
	a.Close()
	if err := Lock(fd, Exclusive); !errors.Is(err, unix.EBADF) {
		t.Errorf("Lock of a closed file: %v, want EBADF", err)
	}
	if _, err := TryLock(fd, Exclusive); !errors.Is(err, unix.EBADF) {
		t.Errorf("TryLock of a closed file: %v, want EBADF", err)
	}
}

func TestIgnoringEINTR(t *testing.T) {
	errOther := errors.New("other")
	for _, tt := range []struct {
		name  string
		errs  []error // what the call returns, in turn
		want  error
		calls int
	}{
		{"no interruption", []error{nil}, nil, 1},
		{"interrupted twice", []error{unix.EINTR, unix.EINTR, nil}, nil, 3},
		{"another error", []error{errOther}, errOther, 1},
		{"interrupted, then another error", []error{unix.EINTR, errOther}, errOther, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := ignoringEINTR(func() error {
				err := tt.errs[calls]
				calls++
				return err
			})
			if err != tt.want || calls != tt.calls {
				t.Errorf("got %v after %d calls, want %v after %d", err, calls, tt.want, tt.calls)
			}
		})
	}
}
