package tail

// Helpers shared by the tests of the acceptance figures (large_test.go) and
// the benchmarks (bench_test.go): generated big files, counted reads, the
// process's CPU time, and a helper process that follows a file and reports
// its memory.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

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

// keyCount returns how many frames of bf have key.
func (bf *bigFile) keyCount(key string) int {
	audit := (bf.n + 4) / 5 // frames 0, 5, 10, ...
	if key == "audit" {
		return audit
	}
	return bf.n - audit
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

// readCost is what a follower read: calls of ReadAt, bytes asked for,
// beacon-sized blocks (each read counts as its length divided by the beacon
// interval, rounded up) and the largest read.
type readCost struct {
	reads, bytes, blocks, largest int64
}

// readCounter adds up the reads of the countingFiles that share it.
type readCounter struct {
	block int64 // the beacon interval of the file
	mu    sync.Mutex
	cost  readCost
}

func (c *readCounter) add(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cost.reads++
	c.cost.bytes += int64(n)
	c.cost.blocks += (int64(n) + c.block - 1) / c.block
	c.cost.largest = max(c.cost.largest, int64(n))
}

func (c *readCounter) get() readCost {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cost
}

// open is a testHooks.open that counts the reads of the files it opens.
func (c *readCounter) open(name string) (file, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c}, nil
}

// countingFile counts the reads of a file.
type countingFile struct {
	*os.File
	c *readCounter
}

func (c countingFile) ReadAt(p []byte, off int64) (int, error) {
	c.c.add(len(p))
	return c.File.ReadAt(p, off)
}

// seekFollower opens a replay follower of key on bf at start and returns
// it (the caller closes it) and its first record, with what New read to
// find the start (the bisection over beacons) and what it read until the
// first record left Next (the bisection and the pass from the beacon to the
// frame).
func seekFollower(tb testing.TB, bf *bigFile, key string, start Start) (fl *Follower, first *Record, bisect, total readCost) {
	tb.Helper()
	c := &readCounter{block: int64(bf.interval)}
	fl, err := newFollower(Options{Path: bf.path, Key: key, Start: start, Replay: true}, testHooks{open: c.open})
	if err != nil {
		tb.Fatal(err)
	}
	bisect = c.get()
	first, err = fl.Next(context.Background())
	if err != nil {
		fl.Close()
		tb.Fatal(err)
	}
	return fl, first, bisect, c.get()
}

// idleFollowers follows n files that nobody writes, past their records, and
// returns once every follower waits. The test's cleanup closes them.
func idleFollowers(tb testing.TB, n int) {
	tb.Helper()
	dir := tb.TempDir()
	for i := range n {
		path := filepath.Join(dir, fmt.Sprintf("idle-%d.ss", i))
		writeFile(tb, path, streamfile.Header{FileName: "idle", CreatedAtMs: uint64(i), BeaconInterval: 1024}, frames("idle", 1, 3, 1, 10))
		fl, err := New(Options{Path: path})
		if err != nil {
			tb.Fatal(err)
		}
		items, stop := follow(tb, fl)
		tb.Cleanup(func() { stop(); fl.Close() })
		collect(tb, items, 3, 10*time.Second)
	}
	time.Sleep(100 * time.Millisecond) // let the followers reach their wait
}

// cpuShare waits for d and returns the share of one core that the process
// used meanwhile.
func cpuShare(tb testing.TB, d time.Duration) (share float64, used time.Duration) {
	before := cpuTime(tb)
	time.Sleep(d)
	used = cpuTime(tb) - before
	return float64(used) / float64(d), used
}

// cpuTime returns the user and system time of the process (getrusage).
func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// followMemory is what a helper process that followed a file reports, in
// bytes.
type followMemory struct {
	peakRSS int64 // VmHWM
	heapSys int64 // the Go heap obtained from the system, at the end
	out     string
}

// followInHelper follows bf from the beginning to its last record in a
// helper process (a live follower, as the daemon runs it) and returns its
// memory figures.
func followInHelper(tb testing.TB, bf *bigFile) followMemory {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=rss", "TAIL_TEST_FILE="+bf.path, "TAIL_TEST_RECORDS="+strconv.Itoa(bf.n),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("helper: %v\n%s", err, out)
	}
	m := followMemory{out: strings.TrimSpace(string(out))}
	for line := range strings.Lines(string(out)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmHWM":
			m.peakRSS = kb << 10
		case "GoHeapSys":
			m.heapSys = kb << 10
		}
	}
	if m.peakRSS == 0 {
		tb.Fatalf("helper printed no VmHWM:\n%s", out)
	}
	return m
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
// its memory figures from /proc/self/status, and the Go heap obtained from
// the system as GoHeapSys.
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
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("GoHeapSys: %d kB\n", ms.HeapSys>>10)
	return sc.Err()
}
