package ratelog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestTrouble: a failure repeating many times is logged at once, then at
// most every Every with the count left out; its end is logged
// once; a trouble that comes and goes stays limited.
func TestTrouble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		logger := textLogger(&buf)
		var l Trouble
		errFull := errors.New("no space left on device")
		steps := []struct {
			wait time.Duration
			fail bool // else it passed
			want string
		}{
			{0, true, `level=ERROR msg=failing err="no space left on device"`},
			{time.Second, true, ""},
			{time.Second, true, ""},
			{9 * time.Second, true, `level=ERROR msg=failing suppressed=2 err="no space left on device"`},
			{time.Second, false, `level=INFO msg=passed after=12s`},
			{time.Second, true, ""},  // a new spell, 2 s after the last line
			{time.Second, false, ""}, // its end, 2 s after the last one
			{20 * time.Second, true, `level=ERROR msg=failing suppressed=1 err="no space left on device"`},
			{time.Second, false, `level=INFO msg=passed after=1s`},
		}
		for i, s := range steps {
			time.Sleep(s.wait)
			buf.Reset()
			if s.fail {
				l.Failed(logger, "failing", errFull)
			} else {
				l.Passed(logger, "passed")
			}
			if got := strings.TrimSpace(buf.String()); got != s.want {
				t.Errorf("step %d: logged %q, want %q", i, got, s.want)
			}
		}
	})
}

func TestLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		logger := textLogger(&buf)
		var l Line
		for i, wait := range []time.Duration{0, time.Second, time.Second, 8 * time.Second, time.Second} {
			time.Sleep(wait)
			l.Warn(logger, "cut", "seq", i)
		}
		want := "level=WARN msg=cut seq=0 suppressed=0\nlevel=WARN msg=cut seq=3 suppressed=2\n"
		if got := buf.String(); got != want {
			t.Errorf("logged\n%s\nwant\n%s", got, want)
		}
	})
}

// textLogger returns a text logger writing to buf without timestamps, so
// that its lines can be compared.
func textLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// TestLimiterOverdue: lines left out are overdue once Every passed since the
// last one let through, and then count as a line: the next is left out
// again for Every.
func TestLimiterOverdue(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if ok, _ := l.Allow(t0); !ok {
		t.Fatal("the first line was left out")
	}
	if n := l.Overdue(t0.Add(Every)); n != 0 {
		t.Fatalf("overdue %d with none left out", n)
	}
	l.Allow(t0.Add(time.Second))
	l.Allow(t0.Add(2 * time.Second))
	for _, tc := range []struct {
		at   time.Duration
		want int
	}{{Every - time.Nanosecond, 0}, {Every, 2}, {Every + time.Second, 0}} {
		if n := l.Overdue(t0.Add(tc.at)); n != tc.want {
			t.Fatalf("overdue at %s: %d, want %d", tc.at, n, tc.want)
		}
	}
	if ok, _ := l.Allow(t0.Add(Every + time.Second)); ok {
		t.Fatal("a line let through less than Every after the overdue ones were logged")
	}
}

func TestLimiterWait(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if w := l.Wait(t0); w != 0 {
		t.Fatalf("wait %s before the first line, want 0", w)
	}
	l.Allow(t0)
	for _, tc := range []struct{ at, want time.Duration }{{0, Every}, {3 * time.Second, Every - 3*time.Second}, {Every, 0}, {Every + time.Second, 0}} {
		if w := l.Wait(t0.Add(tc.at)); w != tc.want {
			t.Errorf("wait at %s: %s, want %s", tc.at, w, tc.want)
		}
	}
}

func TestLimiterDrain(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	l.Allow(t0)
	if n := l.Drain(); n != 0 {
		t.Fatalf("drained %d with none left out", n)
	}
	l.Allow(t0.Add(time.Second))
	l.Allow(t0.Add(2 * time.Second))
	if n := l.Drain(); n != 2 {
		t.Fatalf("drained %d, want 2, before Every passed", n)
	}
	if n := l.Drain(); n != 0 {
		t.Fatalf("drained %d again", n)
	}
	if ok, suppressed := l.Allow(t0.Add(Every)); !ok || suppressed != 0 {
		t.Fatalf("Allow after Drain: %t, %d suppressed; want the line, none suppressed (Drain leaves the time of the last line)", ok, suppressed)
	}
}
