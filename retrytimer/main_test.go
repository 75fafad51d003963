package retrytimer

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCopy returns a copy named key, due at due, with a record of size
// bytes (at least its prefix): "<due in Unix ns>;record of <key>;", so that
// Fire can check it was not called early, then the byte at index i is
// 'a'+i%26, appended a run of the alphabet at a time.
func testCopy(key string, due time.Time, size int) Copy {
	const alphabet = "abcdefghijklmnopqrstuvwxyz"
	record := fmt.Appendf(make([]byte, 0, size), "%d;record of %s;", due.UnixNano(), key)
	for i := len(record); i < size; i = len(record) {
		record = append(record, alphabet[i%26:min(26, i%26+size-i)]...)
	}
	return Copy{Stream: "orders", Key: key, Record: record}
}

// dueOf returns the due time a test copy carries.
func dueOf(t testing.TB, c Copy) time.Time {
	prefix, _, ok := bytes.Cut(c.Record, []byte(";"))
	ns, err := strconv.ParseInt(string(prefix), 10, 64)
	if !ok || err != nil {
		t.Fatalf("copy %q carries no due time: record %.40q", c.Key, c.Record)
	}
	return time.Unix(0, ns)
}

// fired is one call of a recorder's Fire.
type fired struct {
	key string
	at  time.Time
}

// recorder is a FireFunc that records what it fires and fails the test if
// a copy fires before its due time. fail, if set, decides a Fire's error.
type recorder struct {
	t    testing.TB
	fail func(c Copy) error

	mu    sync.Mutex
	fired []fired
}

func (r *recorder) fire(_ context.Context, c Copy) error {
	now := time.Now()
	if due := dueOf(r.t, c); now.Before(due) {
		r.t.Errorf("copy %q fired at %v, before its due time %v", c.Key, now, due)
	}
	want := testCopy(c.Key, dueOf(r.t, c), len(c.Record))
	if !bytes.Equal(c.Record, want.Record) || c.Stream != want.Stream {
		r.t.Errorf("copy %q fired with stream %q record %q, want %q %q", c.Key, c.Stream, c.Record, want.Stream, want.Record)
	}
	if r.fail != nil {
		if err := r.fail(c); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fired = append(r.fired, fired{c.Key, now})
	return nil
}

func (r *recorder) all() []fired {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fired(nil), r.fired...)
}

// mode is a way to open a queue: memory-only or with a spool.
type mode struct {
	name  string
	spool bool
}

var modes = []mode{{"memory", false}, {"spool", true}}

func (m mode) dir(t testing.TB) string {
	if m.spool {
		return t.TempDir()
	}
	return ""
}

// mustOpen opens a queue and closes it when the test ends.
func mustOpen(t *testing.T, opts Options) *Queue {
	t.Helper()
	q, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return q
}

// runQueue runs q.Run until the test ends, and checks it returns nil.
func runQueue(t *testing.T, q *Queue) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func mustSchedule(t testing.TB, q *Queue, key string, due time.Time) {
	t.Helper()
	if err := q.Schedule(testCopy(key, due, 0), due); err != nil {
		t.Fatalf("Schedule(%q): %v", key, err)
	}
}
