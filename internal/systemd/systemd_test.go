package systemd

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
)

func TestNotifier(t *testing.T) {
	conn, path := testutil.ListenNotify(t)
	t.Setenv("NOTIFY_SOCKET", path)
	n := NewNotifier()
	read := func() string {
		buf := make([]byte, 1024)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:k])
	}
	if err := n.Send("READY=1\nSTATUS=ok"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "READY=1\nSTATUS=ok" {
		t.Errorf("got %q", got)
	}
	if err := n.Reloading(); err != nil {
		t.Fatal(err)
	}
	got := read()
	usec, ok := strings.CutPrefix(got, "RELOADING=1\nMONOTONIC_USEC=")
	if v, err := strconv.ParseInt(usec, 10, 64); !ok || err != nil || v <= 0 {
		t.Errorf("reloading sent %q, want RELOADING=1 and a monotonic time", got)
	}
}

func TestNotifierOutsideSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := NewNotifier().Send("READY=1"); err != nil {
		t.Errorf("Send without NOTIFY_SOCKET: %v, want nothing done", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"x", "", 0},
		{"0", "", 0},
		{"2000000", "", time.Second},
		{"2000000", strconv.Itoa(os.Getpid()), time.Second},
		{"2000000", "1", 0}, // another process's watchdog
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		t.Setenv("WATCHDOG_PID", tc.pid)
		if got := WatchdogInterval(); got != tc.want {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %s, want %s", tc.usec, tc.pid, got, tc.want)
		}
	}
}

func TestJournalHandler(t *testing.T) {
	var b bytes.Buffer
	logger := slog.New(NewJournalHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})).With("component", "x")
	logger.Debug("d")
	logger.Info("i", "k", 1)
	logger.Warn("w")
	logger.Error("e")
	want := "<7>msg=d component=x\n<6>msg=i component=x k=1\n<4>msg=w component=x\n<3>msg=e component=x\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestIsJournalStream(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	if !IsJournalStream(f) {
		t.Error("the file JOURNAL_STREAM names is not taken for the journal's stream")
	}
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1))
	if IsJournalStream(f) {
		t.Error("another inode is taken for the journal's stream")
	}
	t.Setenv("JOURNAL_STREAM", "")
	if IsJournalStream(f) {
		t.Error("without JOURNAL_STREAM, a file is taken for the journal's stream")
	}
}
