package durable

import (
	"errors"

	"golang.org/x/sys/unix"
)

// LockKind is the kind of a flock(2) lock.
type LockKind int

const (
	// Shared is a lock that other shared locks may hold at the same time
	// (LOCK_SH): readers that keep writers out.
	Shared LockKind = unix.LOCK_SH
	// Exclusive is a lock that no other lock may hold at the same time
	// (LOCK_EX).
	Exclusive LockKind = unix.LOCK_EX
)

// Lock takes a flock(2) lock of the given kind on the open file fd,
// waiting until no conflicting lock is held. A wait that a signal
// interrupts is resumed. The error is flock's errno, for the caller to name
// the file.
func Lock(fd uintptr, kind LockKind) error {
	return ignoringEINTR(func() error { return unix.Flock(int(fd), int(kind)) })
}

// TryLock takes a flock(2) lock of the given kind on the open file fd
// without waiting. It reports false, with no error, when another open file
// description holds a conflicting lock on the file, in this process or
// another.
func TryLock(fd uintptr, kind LockKind) (bool, error) {
	err := ignoringEINTR(func() error { return unix.Flock(int(fd), int(kind)|unix.LOCK_NB) })
	if errors.Is(err, unix.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}

// Unlock releases the flock(2) lock held on the open file fd. Closing the
// last descriptor of the open file description releases it too.
func Unlock(fd uintptr) error {
	return unix.Flock(int(fd), unix.LOCK_UN)
}

// ignoringEINTR calls fn until it returns something other than EINTR, the
// error of a system call that a signal interrupted before it could finish.
// Go installs its signal handlers with SA_RESTART, so the kernel restarts
// flock by itself in most cases; this covers the rest.
func ignoringEINTR(fn func() error) error {
	for {
		err := fn()
		if err != unix.EINTR {
			return err
		}
	}
}
