package tail

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// largeEnv turns on the tests and benchmark sizes of the acceptance
// figures: 1 GB and 2 GB files, a 10 s idle measurement.
const largeEnv = "STREAMD_LARGE_TESTS"

func large() bool { return os.Getenv(largeEnv) == "1" }

// bigFile is a generated stream file: frame i has key "audit" when i%5 == 0
// and "orders" otherwise, sequences counting from 1 per key, timestamp
// bigBaseMs+i, and a payload of a fixed size.
type bigFile struct {
	path     string
	size     int64
	n        int
	interval uint32
}

const bigBaseMs = 1_700_000_000_000

func bigKey(i int) string {
	if i%5 == 0 {
		return "audit"
	}
	return "orders"
}

var bigFiles struct {
	sync.Mutex
	dir   string
	files map[string]*bigFile
}

// getBigFile writes (once per test binary run) a file of about size bytes.
func getBigFile(t testing.TB, size int64, payload int, interval uint32) *bigFile {
	t.Helper()
	bigFiles.Lock()
	defer bigFiles.Unlock()
	name := fmt.Sprintf("big-%d-%d-%d.ss", size, payload, interval)
	if f := bigFiles.files[name]; f != nil {
		return f
	}
	if bigFiles.dir == "" {
		dir, err := os.MkdirTemp("", "streamd-tail-")
		if err != nil {
			t.Fatal(err)
		}
		bigFiles.dir, bigFiles.files = dir, make(map[string]*bigFile)
	}
	path := filepath.Join(bigFiles.dir, name)
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: name, CreatedAtMs: 1, BeaconInterval: interval}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := make([]byte, payload)
	for i := range p {
		p[i] = byte(i * 7)
	}
	n := int(size / int64(payload+38))
	batch := make([]streamfile.Frame, 0, max(1, (4<<20)/(payload+38)))
	var seq [2]uint64
	for i := range n {
		k := bigKey(i)
		s := &seq[0]
		if k == "audit" {
			s = &seq[1]
		}
		*s++
		batch = append(batch, streamfile.Frame{Key: k, Seq: *s, TimestampMs: bigBaseMs + uint64(i), Payload: p})
		if len(batch) == cap(batch) || i == n-1 {
			if err := w.Append(batch...); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	f := &bigFile{path: path, size: w.Size(), n: n, interval: interval}
	bigFiles.files[name] = f
	return f
}

func cleanupBigFiles() {
	bigFiles.Lock()
	defer bigFiles.Unlock()
	if bigFiles.dir != "" {
		os.RemoveAll(bigFiles.dir)
	}
}

// countingFile counts the reads of a file.
type countingFile struct {
	*os.File
	reads, bytes *atomic.Int64
}

func (c countingFile) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	c.bytes.Add(int64(len(p)))
	return c.File.ReadAt(p, off)
}

// TestSeekReads starts followers at seq: and time: positions in a large file
// and counts what New reads: a bisection over beacons, not a scan.
func TestSeekReads(t *testing.T) {
	size := int64(64 << 20)
	if large() {
		size = 1 << 30
	}
	bf := getBigFile(t, size, 1024, 64<<10)
	per := bf.n / 5 * 4 // orders frames
	for _, tc := range []struct {
		start   string
		key     string
		wantSeq uint64
	}{
		{"seq:1", "orders", 1},
		{"seq:" + strconv.Itoa(per/3), "orders", uint64(per / 3)},
		{"seq:" + strconv.Itoa(per-5), "orders", uint64(per - 5)},
		{"seq:" + strconv.Itoa(bf.n/5-1), "audit", uint64(bf.n/5 - 1)},
		// Frame i has timestamp base+i: strictly after base+i is frame i+1
		// (orders, seq i+1 - (i+1)/5 - 1 ... checked below by timestamp).
		{"time:" + time.UnixMilli(bigBaseMs+int64(bf.n/2)).UTC().Format(time.RFC3339Nano), "orders", 0},
		{"time:" + time.UnixMilli(bigBaseMs+int64(bf.n-20)).UTC().Format(time.RFC3339Nano), "audit", 0},
	} {
		t.Run(tc.start+"/"+tc.key, func(t *testing.T) {
			start, err := ParseStart(tc.start)
			if err != nil {
				t.Fatal(err)
			}
			var reads, bytes atomic.Int64
			open := func(name string) (file, error) {
				f, err := os.Open(name)
				if err != nil {
					return nil, err
				}
				return countingFile{f, &reads, &bytes}, nil
			}
			fl, err := newFollower(Options{Path: bf.path, Key: tc.key, Start: start, Replay: true}, testHooks{open: open})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			blocks := bytes.Load() / int64(bf.interval)
			t.Logf("%d reads, %d bytes, %d beacon-sized blocks", reads.Load(), bytes.Load(), blocks)
			if reads.Load() > 64 || blocks > 64 {
				t.Errorf("%d reads of %d bytes (%d blocks of %d), want at most 64", reads.Load(), bytes.Load(), blocks, bf.interval)
			}
			r, err := fl.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if r.Key != tc.key {
				t.Fatalf("first record %s/%d, want key %s", r.Key, r.Seq, tc.key)
			}
			if tc.wantSeq != 0 && r.Seq != tc.wantSeq {
				t.Fatalf("first record has seq %d, want %d", r.Seq, tc.wantSeq)
			}
			if tc.wantSeq == 0 {
				i := int(r.TimestampMs - bigBaseMs)
				after := int(start.after.UnixMilli() - bigBaseMs)
				if i <= after || slices.ContainsFunc([]int{after + 1, after + 2, after + 3, after + 4, after + 5}, func(j int) bool { return j < i && bigKey(j) == tc.key }) {
					t.Fatalf("first record is frame %d, want the first %s frame after %d", i, tc.key, after)
				}
			}
		})
	}
}

// TestIdleCPU follows ten files that nobody writes and measures the CPU
// time the process uses meanwhile: no busy loops.
func TestIdleCPU(t *testing.T) {
	d := 2 * time.Second
	if large() {
		d = 10 * time.Second
	}
	dir := t.TempDir()
	var stops []func()
	for i := range 10 {
		path := filepath.Join(dir, fmt.Sprintf("idle-%d.ss", i))
		writeFile(t, path, streamfile.Header{FileName: "idle", CreatedAtMs: uint64(i), BeaconInterval: 1024}, frames("idle", 1, 3, 1, 10))
		fl, err := New(Options{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		defer fl.Close()
		items, stop := follow(t, fl)
		defer stop()
		collect(t, items, 3, 10*time.Second)
		stops = append(stops, stop)
	}
	time.Sleep(100 * time.Millisecond) // let the followers reach their wait
	before := cpuTime(t)
	time.Sleep(d)
	used := cpuTime(t) - before
	share := float64(used) / float64(d)
	t.Logf("10 idle followers used %v of CPU in %v: %.3f%% of one core", used, d, 100*share)
	if share >= 0.01 {
		t.Errorf("idle followers used %.2f%% of one core, want < 1%%", 100*share)
	}
	for _, stop := range stops {
		stop()
	}
}

func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestFollowRSS follows a large file from the beginning in a helper process
// and checks its peak resident memory.
func TestFollowRSS(t *testing.T) {
	size := int64(64 << 20)
	if large() {
		size = 2 << 30
	}
	bf := getBigFile(t, size, 1024, 64<<10) // TestSeekReads's file, when of the same size
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=rss", "TAIL_TEST_FILE="+bf.path, "TAIL_TEST_RECORDS="+strconv.Itoa(bf.n),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var hwm int64
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	t.Logf("following %d MB: peak RSS %d MB (%s)", bf.size>>20, hwm>>10, strings.TrimSpace(string(out)))
	limit := int64(50 << 10)
	if raceEnabled {
		limit *= 2 // the race detector's shadow memory
	}
	if hwm == 0 || hwm > limit {
		t.Fatalf("peak RSS %d kB, want under %d kB", hwm, limit)
	}
}

// TestHelperProcess is not a test: it is the second process of tests that
// start one, and does nothing unless helperEnv is set.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(helperEnv) {
	case "":
		return
	case "rss":
		n, _ := strconv.Atoi(os.Getenv("TAIL_TEST_RECORDS"))
		if err := helperFollow(os.Getenv("TAIL_TEST_FILE"), n); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(2)
}

// helperFollow follows path live until it delivered n records, then prints
// its memory figures from /proc/self/status.
func helperFollow(path string, n int) error {
	fl, err := New(Options{Path: path})
	if err != nil {
		return err
	}
	defer fl.Close()
	for range n {
		if _, err := fl.Next(context.Background()); err != nil {
			return err
		}
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "VmHWM:") || strings.HasPrefix(sc.Text(), "VmRSS:") {
			fmt.Println(sc.Text())
		}
	}
	return sc.Err()
}

// BenchmarkFollow compares following a file from the beginning into a
// no-op consumer with decoding it with a bare streamfile.Decoder. The
// paired runs alternate the two, so that other load on the machine weighs
// on both alike, and report the follower's speed as a share of the
// decoder's. With STREAMD_LARGE_TESTS=1 the file is 1 GB.
func BenchmarkFollow(b *testing.B) {
	size := int64(64 << 20)
	if large() {
		size = 1 << 30
	}
	for _, payload := range []int{64, 1024} {
		bf := getBigFile(b, size, payload, streamfile.DefaultBeaconInterval)
		b.Run(fmt.Sprintf("payload=%d/decoder", payload), func(b *testing.B) {
			b.SetBytes(bf.size)
			b.ReportAllocs()
			for b.Loop() {
				decodeAll(b, bf)
			}
		})
		b.Run(fmt.Sprintf("payload=%d/follower", payload), func(b *testing.B) {
			b.SetBytes(bf.size)
			b.ReportAllocs()
			for b.Loop() {
				followAll(b, bf)
			}
		})
		b.Run(fmt.Sprintf("payload=%d/paired", payload), func(b *testing.B) {
			b.SetBytes(2 * bf.size)
			var dec, fol time.Duration
			for b.Loop() {
				t0 := time.Now()
				decodeAll(b, bf)
				t1 := time.Now()
				followAll(b, bf)
				dec, fol = dec+t1.Sub(t0), fol+time.Since(t1)
			}
			b.ReportMetric(100*dec.Seconds()/fol.Seconds(), "%decoder-speed")
		})
	}
}

// decodeAll decodes the whole file with a bare decoder.
func decodeAll(b *testing.B, bf *bigFile) {
	f, err := os.Open(bf.path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		b.Fatal(err)
	}
	d := streamfile.NewDecoder(f, h, streamfile.HeaderSize)
	n := 0
	for {
		_, err := d.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		n++
	}
	if n != bf.n {
		b.Fatalf("decoded %d records, want %d", n, bf.n)
	}
}

// followAll follows the file from the beginning until it delivered every
// record.
func followAll(b *testing.B, bf *bigFile) {
	fl, err := New(Options{Path: bf.path})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for range bf.n {
		if _, err := fl.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := fl.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLatency appends one frame every millisecond and measures the
// time from the end of each append to the record leaving Next, with a poll
// interval of 1 s: the notifications carry it. A record that leaves before
// its append returned counts as 0; the from-start figures measure from the
// start of the append instead.
func BenchmarkLatency(b *testing.B) {
	path := filepath.Join(b.TempDir(), "latency.ss")
	writeFile(b, path, streamfile.Header{FileName: "latency.ss", CreatedAtMs: 1, BeaconInterval: streamfile.DefaultBeaconInterval}, nil)
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: time.Second, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	defer fl.Close()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	n := b.N
	started := make([]int64, n) // ns since t0, per sequence
	appended := make([]int64, n)
	received := make([]int64, n)
	t0 := time.Now()
	done := make(chan error, 1)
	go func() {
		for range n {
			r, err := fl.Next(context.Background())
			if err != nil {
				done <- err
				return
			}
			received[r.Seq] = int64(time.Since(t0))
		}
		done <- nil
	}()
	payload := make([]byte, 100)
	b.ResetTimer()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		started[i] = int64(time.Since(t0))
		if err := w.Append(streamfile.Frame{Key: "latency", Seq: uint64(i), TimestampMs: uint64(i), Payload: payload}); err != nil {
			b.Fatal(err)
		}
		appended[i] = int64(time.Since(t0))
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	lat := make([]time.Duration, n)
	fromStart := make([]time.Duration, n)
	for i := range lat {
		lat[i] = time.Duration(max(received[i]-appended[i], 0))
		fromStart[i] = time.Duration(received[i] - started[i])
	}
	slices.Sort(lat)
	slices.Sort(fromStart)
	b.ReportMetric(float64(lat[n/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[n*99/100])/1e6, "p99-ms")
	b.ReportMetric(float64(lat[n-1])/1e6, "max-ms")
	b.ReportMetric(float64(fromStart[n/2])/1e6, "p50-from-start-ms")
	b.ReportMetric(float64(fromStart[n*99/100])/1e6, "p99-from-start-ms")
	b.ReportMetric(float64(obs.count(EventPollRead)), "poll-reads")
}
