package retrytimer

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/streamd/streamd/envelope"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// dueHeader carries a test copy's due time (Unix nanoseconds), so that Fire
// can check it was not called early.
const dueHeader = "x-test-due"

// testCopy returns a copy named key, due at due, with a payload of size
// bytes (at least the key): "payload of <key>;", then the byte at index i
// is 'a'+i%26, appended a run of the alphabet at a time.
func testCopy(key string, due time.Time, size int) Copy {
	const alphabet = "abcdefghijklmnopqrstuvwxyz"
	payload := fmt.Appendf(make([]byte, 0, size), "payload of %s;", key)
	for i := len(payload); i < size; i = len(payload) {
		payload = append(payload, alphabet[i%26:min(26, i%26+size-i)]...)
	}
	return Copy{
		Stream:  "orders",
		Key:     key,
		Headers: envelope.Headers{{Name: dueHeader, Value: strconv.AppendInt(nil, due.UnixNano(), 10)}},
		Payload: payload,
	}
}

// dueOf returns the due time a test copy carries.
func dueOf(t testing.TB, c Copy) time.Time {
	v, ok := c.Headers.Get(dueHeader)
	if !ok {
		t.Fatalf("copy %q has no %s header", c.Key, dueHeader)
	}
	ns, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		t.Fatalf("copy %q: %v", c.Key, err)
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
	want := testCopy(c.Key, dueOf(r.t, c), len(c.Payload))
	if string(c.Payload) != string(want.Payload) || c.Stream != want.Stream {
		r.t.Errorf("copy %q fired with stream %q payload %q, want %q %q", c.Key, c.Stream, c.Payload, want.Stream, want.Payload)
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
