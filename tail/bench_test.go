package tail

// The benchmarks of issue 3's acceptance figures, for `make bench` and
// BENCHMARKS.md (tools/benchreport/goals.toml names each benchmark and
// metric it reads). They run only with -bench; the tests of the same
// figures are in large_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// The sizes that the acceptance items name, where the figure depends on
// them: the reads of a bisection grow with the file, and a leak with what
// was followed.
const (
	seekFileSize = 1 << 30          // item 7: a seek in a 1 GB file
	rssFileSize  = 2 << 30          // item 6: following a 2 GB file
	idleWindow   = 10 * time.Second // item 5: over 10 s
)

// BenchmarkFollow compares following a file from the beginning into a
// no-op consumer with decoding it with a bare streamfile.Decoder. The
// paired runs alternate the two, so that other load on the machine weighs
// on both alike, and report the follower's speed as a share of the
// decoder's (the median of the pairs), and the file's size. The file is 64 MiB (the ratio is one of
// speeds per byte, which a larger file does not change); with
// STREAMD_LARGE_TESTS=1 it is the 1 GB of the acceptance item.
func BenchmarkFollow(b *testing.B) {
	size := int64(64 << 20)
	if testutil.Large() {
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
			var shares []float64
			for b.Loop() {
				t0 := time.Now()
				decodeAll(b, bf)
				t1 := time.Now()
				followAll(b, bf)
				shares = append(shares, t1.Sub(t0).Seconds()/time.Since(t1).Seconds())
			}
			// The median pair: a pair that other load hit unevenly does
			// not move it.
			slices.Sort(shares)
			b.ReportMetric(100*shares[len(shares)/2], "%decoder-speed")
			b.ReportMetric(float64(bf.size)/(1<<20), "file-MiB")
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
// interval of 1 s: the notifications carry it, and poll-reads counts the
// polls that found data the notifications had not delivered. A record that
// leaves before its append returned counts as 0; the from-start figures
// measure from the start of the append instead.
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

// BenchmarkSeek starts replay followers at seq: (by=seq) and time:
// (by=time) positions spread over a 1 GiB file of 1 KiB payloads with a
// beacon every 64 KiB, alternating the keys orders and audit, and counts
// what each seek reads until its first record leaves Next: the bisection
// over beacons, then the pass from the beacon to the frame. It reports the
// mean and the worst seek: reads, beacon-sized blocks (each read counts as
// its length over the beacon interval, rounded up) and the largest read.
func BenchmarkSeek(b *testing.B) {
	bf := getBigFile(b, seekFileSize, 1024, 64<<10)
	for _, by := range []string{"seq", "time"} {
		b.Run("by="+by, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(3, 7))
			var sum, worst readCost
			var bisectReads int64
			seeks := 0
			for b.Loop() {
				key := "orders"
				if seeks%2 == 1 {
					key = "audit"
				}
				var pos string
				var wantSeq uint64
				var after int // frame index
				switch by {
				case "seq":
					wantSeq = 1 + uint64(rng.IntN(bf.keyCount(key)))
					pos = "seq:" + strconv.FormatUint(wantSeq, 10)
				case "time":
					after = rng.IntN(bf.n - 5)
					pos = "time:" + time.UnixMilli(bigBaseMs+int64(after)).UTC().Format(time.RFC3339Nano)
				}
				start, err := ParseStart(pos)
				if err != nil {
					b.Fatal(err)
				}
				fl, r, bisect, cost := seekFollower(b, bf, key, start)
				ok := r.Key == key && (wantSeq == 0 || r.Seq == wantSeq)
				if by == "time" {
					i := int(r.TimestampMs - bigBaseMs)
					ok = ok && i > after && !slices.ContainsFunc([]int{after + 1, after + 2, after + 3, after + 4, after + 5}, func(j int) bool { return j < i && bigKey(j) == key })
				}
				if !ok {
					fl.Close()
					b.Fatalf("%s for %s: first record %s seq %d at ts %d", pos, key, r.Key, r.Seq, r.TimestampMs)
				}
				if err := fl.Close(); err != nil {
					b.Fatal(err)
				}
				seeks++
				bisectReads += bisect.reads
				sum.reads += cost.reads
				sum.blocks += cost.blocks
				worst.reads = max(worst.reads, cost.reads)
				worst.blocks = max(worst.blocks, cost.blocks)
				worst.largest = max(worst.largest, cost.largest)
			}
			b.ReportMetric(float64(sum.reads)/float64(seeks), "reads/seek")
			b.ReportMetric(float64(bisectReads)/float64(seeks), "bisect-reads/seek")
			b.ReportMetric(float64(sum.blocks)/float64(seeks), "blocks/seek")
			b.ReportMetric(float64(worst.reads), "max-reads/seek")
			b.ReportMetric(float64(worst.blocks), "max-blocks/seek")
			b.ReportMetric(float64(worst.largest)/1024, "max-KiB/read")
			b.ReportMetric(float64(bf.interval)/1024, "beacon-KiB")
			b.ReportMetric(float64(bf.size)/(1<<20), "file-MiB")
		})
	}
}

// BenchmarkIdleCPU follows ten files that nobody writes, with the default
// poll interval, and reports the CPU time (getrusage: user and system) that
// the whole process used over each 10 s window, as a percentage of one
// core. One window is one iteration.
func BenchmarkIdleCPU(b *testing.B) {
	idleFollowers(b, 10)
	var used, window time.Duration
	for b.Loop() {
		_, u := cpuShare(b, idleWindow)
		used += u
		window += idleWindow
	}
	b.ReportMetric(100*used.Seconds()/window.Seconds(), "%one-core")
}

// BenchmarkFollowRSS follows a 2 GiB file of 1 KiB payloads from the
// beginning to its last record with a live follower in a helper process,
// and reports the helper's peak resident set (VmHWM) and the Go heap it
// obtained from the system, the worst of the runs; its MB/s count the
// helper's start-up.
func BenchmarkFollowRSS(b *testing.B) {
	bf := getBigFile(b, rssFileSize, 1024, 64<<10)
	b.SetBytes(bf.size)
	var peak, heap int64
	for b.Loop() {
		m := followInHelper(b, bf)
		peak, heap = max(peak, m.peakRSS), max(heap, m.heapSys)
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
	b.ReportMetric(float64(heap)/(1<<20), "heap-sys-MiB")
	b.ReportMetric(float64(bf.size)/(1<<20), "file-MiB")
}
