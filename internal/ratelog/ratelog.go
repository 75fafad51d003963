// Package ratelog limits the log lines of a condition that repeats, possibly
// many times a second: the first line at once, then at most one every
// [Every], each with the count of the lines left out since the last one.
package ratelog

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Every is the least time between two lines of one condition.
const Every = 10 * time.Second

// Limiter lets a repeated log line through at most once every [Every]. The
// zero value lets the first line through. It is not safe for concurrent use.
type Limiter struct {
	last       time.Time
	suppressed int
}

// Allow reports whether a line may be logged at now and, if so, how many
// were left out since the last one.
func (l *Limiter) Allow(now time.Time) (ok bool, suppressed int) {
	if !l.last.IsZero() && now.Sub(l.last) < Every {
		l.suppressed++
		return false, 0
	}
	suppressed = l.suppressed
	l.last, l.suppressed = now, 0
	return true, suppressed
}

// Overdue returns how many lines were left out since the last one let
// through, once Every has passed since it, and counts a line logged at now
// for them; 0 otherwise. A caller that checks now and then logs them, so
// that a line left out is not left out for good when no other follows.
func (l *Limiter) Overdue(now time.Time) int {
	if l.suppressed == 0 || now.Sub(l.last) < Every {
		return 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return n
}

// Wait returns how long after now the next line will be let through: a
// caller that logs the lines left out once it may (Overdue) waits that
// long.
func (l *Limiter) Wait(now time.Time) time.Duration {
	return max(l.last.Add(Every).Sub(now), 0)
}

// Drain returns how many lines were left out since the last one let
// through, and forgets them: for a last line when the condition's source
// ends, whatever the time.
func (l *Limiter) Drain() int {
	n := l.suppressed
	l.suppressed = 0
	return n
}

// Reset counts a line as logged at now: the next one is let through Every
// after it.
func (l *Limiter) Reset(now time.Time) { l.last, l.suppressed = now, 0 }

// Line is a warning that repeats, for one record after another, logged
// at most once every [Every] with the count of the lines left out. It is
// safe for concurrent use.
type Line struct {
	mu sync.Mutex
	l  Limiter
}

// Warn logs msg with attrs at warning level, and a "suppressed" count,
// unless a line was logged less than Every ago.
func (l *Line) Warn(logger *slog.Logger, msg string, attrs ...any) {
	l.mu.Lock()
	ok, suppressed := l.l.Allow(time.Now())
	l.mu.Unlock()
	if ok {
		logger.Warn(msg, append(attrs, "suppressed", suppressed)...)
	}
}

// Trouble is a failure that may pass: logged at once, then at most every
// [Every] while it lasts (with the count left out), and once when it passes
// (at most every Every too, for a trouble that comes and goes: the limit
// holds across spells). It is safe for concurrent use.
type Trouble struct {
	failing    atomic.Bool // written under mu; read without it on hot paths
	mu         sync.Mutex
	since      time.Time
	log        Limiter
	lastPassed time.Time
}

// Failing reports whether the trouble lasts. It takes no lock: readers
// call it once per record.
func (t *Trouble) Failing() bool { return t.failing.Load() }

// Failed records err and logs it with msg unless a line of this trouble was
// logged less than Every ago. It reports whether the trouble began with
// it, for a caller that counts each spell once.
func (t *Trouble) Failed(logger *slog.Logger, msg string, err error, attrs ...any) (began bool) {
	t.mu.Lock()
	now := time.Now()
	began = !t.failing.Load()
	if began {
		t.since = now
	}
	t.failing.Store(true)
	ok, suppressed := t.log.Allow(now)
	t.mu.Unlock()
	if !ok {
		return began
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	logger.Error(msg, append(attrs, "err", err)...)
	return began
}

// Passed ends the trouble, logging msg with how long it lasted, if it was
// failing.
func (t *Trouble) Passed(logger *slog.Logger, msg string, attrs ...any) {
	t.mu.Lock()
	if !t.failing.Load() {
		t.mu.Unlock()
		return
	}
	since, now := t.since, time.Now()
	t.failing.Store(false)
	if !t.lastPassed.IsZero() && now.Sub(t.lastPassed) < Every {
		t.mu.Unlock()
		return
	}
	t.lastPassed = now
	t.mu.Unlock()
	logger.Info(msg, append(attrs, "after", now.Sub(since).Round(time.Millisecond))...)
}
