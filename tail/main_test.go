package tail

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/streamd/streamd/streamfile"
)

const vectorDir = "../testdata/streamfile"

// helperEnv makes the test binary play a helper process (TestHelperProcess).
const helperEnv = "TAIL_TEST_HELPER"

func TestMain(m *testing.M) {
	code := m.Run()
	cleanupBigFiles()
	if code == 0 && os.Getenv(helperEnv) == "" {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// got is a delivered record, copied.
type got struct {
	streamfile.Frame
	Offset, End int64
	File        streamfile.Identity
}

func (g got) String() string {
	return fmt.Sprintf("%s/%d seq %d at %d (ino %d, %q)", g.Key, g.Shard, g.Seq, g.Offset, g.File.Ino, g.File.FileName)
}

func copyRecord(r *Record) got {
	g := got{Frame: r.Frame, Offset: r.Offset, End: r.End, File: r.File}
	g.Payload = bytes.Clone(r.Payload)
	return g
}

// sameFrames reports the first difference between the frames of two lists.
func sameFrames(gotten []got, want []streamfile.Frame) error {
	for i := range min(len(gotten), len(want)) {
		g, w := gotten[i], want[i]
		if g.Key != w.Key || g.Shard != w.Shard || g.Seq != w.Seq || g.TimestampMs != w.TimestampMs || !bytes.Equal(g.Payload, w.Payload) {
			return fmt.Errorf("record %d: got %s, want %s/%d seq %d", i, g, w.Key, w.Shard, w.Seq)
		}
	}
	if len(gotten) != len(want) {
		return fmt.Errorf("got %d records, want %d", len(gotten), len(want))
	}
	return nil
}

// vectorRecord is a message line of an expected.ndjson file.
type vectorRecord struct {
	Offset      *int64  `json:"offset"`
	StreamKey   *string `json:"stream_key"`
	ShardID     uint64  `json:"shard_id"`
	Seq         uint64  `json:"seq"`
	TimestampMs uint64  `json:"timestamp_ms"`
	PayloadB64  []byte  `json:"payload_b64"`
}

// vectorFrames returns the messages of a vector's expected file, with their
// offsets.
func vectorFrames(t testing.TB, name string) ([]streamfile.Frame, []int64) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(vectorDir, name+".expected.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	var frames []streamfile.Frame
	var offs []int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v vectorRecord
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		if v.StreamKey == nil || v.Offset == nil {
			continue
		}
		frames = append(frames, streamfile.Frame{Key: *v.StreamKey, Shard: v.ShardID, Seq: v.Seq, TimestampMs: v.TimestampMs, Payload: v.PayloadB64})
		offs = append(offs, *v.Offset)
	}
	return frames, offs
}

func readVector(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorDir, name+".ss"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// observer records what a follower reports; tests read it from other
// goroutines.
type observer struct {
	mu             sync.Mutex
	events         map[Event]int
	records, bytes int64
	troubles       []string // each trouble told, "" for its end
}

func newObserver() *observer { return &observer{events: make(map[Event]int)} }

func (o *observer) Read(records, bytes int64) {
	o.mu.Lock()
	o.records += records
	o.bytes += bytes
	o.mu.Unlock()
}

func (o *observer) Event(e Event) {
	o.mu.Lock()
	o.events[e]++
	o.mu.Unlock()
}

func (o *observer) Trouble(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err == nil {
		o.troubles = append(o.troubles, "")
		return
	}
	o.troubles = append(o.troubles, err.Error())
}

// told returns the troubles told so far.
func (o *observer) told() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.troubles)
}

func (o *observer) count(e Event) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.events[e]
}

func (o *observer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "records=%d bytes=%d", o.records, o.bytes)
	for _, e := range Events {
		if n := o.events[e]; n > 0 {
			fmt.Fprintf(&b, " %s=%d", e, n)
		}
	}
	return b.String()
}

// testLogger logs through t, so that a failing test shows what the
// follower said.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// item is what Next returned, copied.
type item struct {
	rec got
	err error
}

// follow calls fl.Next in a goroutine and sends copies of what it returns
// on the channel, in order, until Next fails. stop cancels it and waits.
func follow(t testing.TB, fl *Follower) (items <-chan item, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	c := make(chan item, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			r, err := fl.Next(ctx)
			if err != nil {
				c <- item{err: err}
				return
			}
			select {
			case c <- item{rec: copyRecord(r)}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return c, func() { cancel(); <-done }
}

// startFollowing opens a follower with opts and follows it (follow) until
// the test ends, and returns its items with the first n records.
func startFollowing(t *testing.T, opts Options, n int) (<-chan item, []got) {
	t.Helper()
	fl, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	items, stop := follow(t, fl)
	t.Cleanup(func() { stop(); fl.Close() })
	return items, collect(t, items, n, 5*time.Second)
}

// noMore fails the test when items brings a record within a few polls.
func noMore(t *testing.T, items <-chan item) {
	t.Helper()
	select {
	case it := <-items:
		t.Fatalf("read more than the records written: %+v", it)
	case <-time.After(100 * time.Millisecond):
	}
}

// nextN calls fl.Next n times, within 10 s in all, and returns copies of
// the records; *read counts them as they come, for an OnWait hook that
// acts on the count.
func nextN(t testing.TB, fl *Follower, n int, read *int) []got {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []got
	for range n {
		r, err := fl.Next(ctx)
		if err != nil {
			t.Fatalf("after %d records: %v", len(out), err)
		}
		out = append(out, copyRecord(r))
		*read++
	}
	return out
}

// collect receives n records, failing at an error or after timeout.
func collect(t testing.TB, items <-chan item, n int, timeout time.Duration) []got {
	t.Helper()
	var out []got
	deadline := time.After(timeout)
	for len(out) < n {
		select {
		case it := <-items:
			if it.err != nil {
				t.Fatalf("after %d of %d records: %v", len(out), n, it.err)
			}
			out = append(out, it.rec)
		case <-deadline:
			t.Fatalf("timed out after %d of %d records", len(out), n)
		}
	}
	return out
}

// frames returns n frames of key with sequences from seq on, timestamps
// from ts on, and payloads of varying size.
func frames(key string, seq uint64, n int, ts uint64, payload int) []streamfile.Frame {
	out := make([]streamfile.Frame, n)
	for i := range out {
		p := make([]byte, payload+(i*37)%(payload+1))
		for j := range p {
			p[j] = byte(int(seq) + i + j)
		}
		out[i] = streamfile.Frame{Key: key, Seq: seq + uint64(i), TimestampMs: ts + uint64(i), Payload: p}
	}
	return out
}

// writeFile creates path with the header and frames (in one batch).
func writeFile(t testing.TB, path string, h streamfile.Header, fs []streamfile.Frame) {
	t.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true, Header: h})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) > 0 {
		if err := w.Append(fs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// appendFrames appends frames to an existing file.
func appendFrames(t testing.TB, path string, fs []streamfile.Frame) {
	t.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(fs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// relink points the symlink link at to, as a rotation does: a new symlink
// renamed over it, so that the path always names a file.
func relink(t testing.TB, link, to string) {
	t.Helper()
	tmp := link + ".tmp"
	if err := os.Symlink(to, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}
