// Package systemd speaks to systemd from inside the service: the sd_notify
// protocol (READY, RELOADING, STOPPING, STATUS, WATCHDOG), the watchdog
// interval systemd asks for, and a slog handler for the journal's stream
// that turns levels into syslog priorities. Outside systemd every part is a
// no-op, so the same binary runs anywhere.
package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier speaks the sd_notify protocol: one datagram per message to the
// unix socket systemd names in $NOTIFY_SOCKET (an "@" prefix is the abstract
// namespace, which the net package handles). Without the variable every
// method does nothing, so streamd runs the same outside systemd.
type Notifier struct {
	addr *net.UnixAddr
}

// NewNotifier returns the notifier of $NOTIFY_SOCKET.
func NewNotifier() *Notifier {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return &Notifier{}
	}
	return &Notifier{addr: &net.UnixAddr{Name: path, Net: "unixgram"}}
}

// Send writes one notification, such as "READY=1" or "STATUS=...".
func (n *Notifier) Send(state string) error {
	if n.addr == nil {
		return nil
	}
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	_, err = conn.Write([]byte(state))
	return errors.Join(err, conn.Close())
}

// Reloading announces a reload with the monotonic timestamp systemd needs
// to match it with the READY=1 that ends it.
func (n *Notifier) Reloading() error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("sd_notify: clock_gettime: %w", err)
	}
	usec := ts.Sec*1_000_000 + ts.Nsec/1_000
	return n.Send("RELOADING=1\nMONOTONIC_USEC=" + strconv.FormatInt(usec, 10))
}

// WatchdogInterval returns how often to send WATCHDOG=1: half of
// $WATCHDOG_USEC, when the variable is set for this process.
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
