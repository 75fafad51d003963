package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/natstest"
)

// natsCLI is the NATS command-line tool whose benchmark publisher
// BenchmarkRunNATS compares streamd with, run with go run.
const natsCLI = "github.com/nats-io/natscli/nats@v0.5.0"

// natsBenchRecords and natsBenchSize are the records of BenchmarkRunNATS
// and their payload size.
const (
	natsBenchRecords = 1_000_000
	natsBenchSize    = 512
)

// BenchmarkRunNATS: the real binary replays 1 000 000 records of 512 B into
// a file-storage JetStream stream of a NATS server in this process, in
// batches of 500 with concurrency 4 (2 000 acknowledgements in flight),
// positions committed; start-up included. Then, against the same server
// and a fresh stream of the same kind each time, the nats tool's own
// JetStream benchmark publisher (nats bench js pub async, which publishes
// batches of 500 and waits for their acknowledgements) publishes as many
// messages of the same size, twice: as it does by default (no headers, no
// message id), with what streamd's messages carry (a Nats-Msg-Id, which
// JetStream checks against its duplicate window, and the same metadata
// headers), and with the message id alone, which shows what the duplicate
// check costs the server. Their rates are the ones it reports. The
// ratios are streamd's rate over each of the three, and the third's over
// the first. Last, streamd replays the
// records again one at a time, with concurrency 512, to show what batches
// gain. Each timed run starts once the disk has taken what the page cache
// holds for it (quietDisk). make bench runs three rounds (-count=3) and
// reports the median of each figure: each ratio is one round's own, so
// that a stretch of a busy machine (this one's CPU is shared) weighs on
// one round rather than on one side of a ratio.
func BenchmarkRunNATS(b *testing.B) {
	srv := natstest.Start(b)
	_, js := srv.Connect()
	bin, dir := benchBinary(b), b.TempDir()
	benchStream(b, filepath.Join(dir, "orders.ss"), natsBenchRecords, natsBenchSize)
	if out, err := exec.Command("go", "run", natsCLI, "--version").CombinedOutput(); err != nil {
		b.Fatalf("go run %s: %v\n%s", natsCLI, err, out)
	}
	handler := fmt.Sprintf("[subscription.handler]\nkind = \"nats\"\nurl = %q\nsubject = \"orders.{key}\"\n", srv.URL())
	// forward replays the file into a fresh stream and returns how long it took.
	forward := func(handler string, concurrency int) time.Duration {
		freshStream(b, js, "ORDERS", "orders.>")
		d, _ := runReplay(b, bin, dir, handler, concurrency)
		checkCommitted(b, dir)
		if info, err := js.Stream(context.Background(), "ORDERS"); err != nil {
			b.Fatal(err)
		} else if st, err := info.Info(context.Background()); err != nil || st.State.Msgs != natsBenchRecords {
			b.Fatalf("the stream holds %v messages (%v), want %d", st.State.Msgs, err, natsBenchRecords)
		}
		return d
	}
	var batches, single time.Duration
	var toolRate, sameRate, dedupRate float64
	for b.Loop() {
		batches += forward(handler+"batch_max_records = 500\n", 4)
		freshStream(b, js, "BENCH", "bench.>")
		toolRate += natsBenchPublish(b, srv.URL())
		freshStream(b, js, "BENCH", "bench.>")
		sameRate += natsBenchPublish(b, srv.URL(), natsBenchSameMessages...)
		freshStream(b, js, "BENCH", "bench.>")
		dedupRate += natsBenchPublish(b, srv.URL(), "--dedup")
		single += forward(handler, 512)
	}
	rate := float64(natsBenchRecords) * float64(b.N) / batches.Seconds()
	toolRate /= float64(b.N)
	sameRate /= float64(b.N)
	dedupRate /= float64(b.N)
	b.ReportMetric(rate, "records/s")
	b.ReportMetric(toolRate, "nats-bench-msgs/s")
	b.ReportMetric(rate/toolRate, "x-nats-bench")
	b.ReportMetric(sameRate, "nats-bench-same-msgs/s")
	b.ReportMetric(rate/sameRate, "x-nats-bench-same")
	b.ReportMetric(dedupRate, "nats-bench-dedup-msgs/s")
	b.ReportMetric(dedupRate/toolRate, "dedup-x-nats-bench")
	b.ReportMetric(rate/dedupRate, "x-nats-bench-dedup")
	b.ReportMetric(float64(natsBenchRecords)*float64(b.N)/single.Seconds(), "single-records/s")
}

// natsBenchSameMessages are the nats bench flags that make its messages
// like streamd's: a Nats-Msg-Id on each, and the headers streamd adds to a
// record without an envelope.
var natsBenchSameMessages = []string{"--dedup",
	"-H", "Streamd-Subscription:bench", "-H", "Streamd-Stream-Key:orders", "-H", "Streamd-Seq:1000000",
	"-H", "Streamd-Shard:0", "-H", "Streamd-Timestamp-Ms:1700000000000", "-H", "Streamd-Attempt:1",
	"-H", "Streamd-Header-stream-sequence:1000000"}

// freshStream deletes the named stream if it exists and creates it again
// on file storage, capturing subject: a new stream with an empty duplicate
// window.
func freshStream(b *testing.B, js jetstream.JetStream, name, subject string) {
	b.Helper()
	ctx := context.Background()
	if err := js.DeleteStream(ctx, name); err != nil && !strings.Contains(err.Error(), "not found") {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
}

// natsPubRate matches the publish rate nats bench reports.
var natsPubRate = regexp.MustCompile(`stats: ([0-9,]+) msgs/sec`)

// natsBenchPublish runs nats bench's JetStream asynchronous publisher into
// the stream BENCH, with the extra flags, and returns the rate it reports.
func natsBenchPublish(b *testing.B, url string, extra ...string) float64 {
	b.Helper()
	args := append([]string{"run", natsCLI, "--server=" + url, "bench", "js", "pub", "async", "bench.x",
		"--stream=BENCH", "--msgs=" + strconv.Itoa(natsBenchRecords), "--size=" + strconv.Itoa(natsBenchSize),
		"--no-progress"}, extra...)
	quietDisk()
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		b.Fatalf("nats bench: %v\n%s", err, out)
	}
	m := natsPubRate.FindSubmatch(out)
	if m == nil {
		b.Fatalf("nats bench printed no publish rate:\n%s", out)
	}
	rate, err := strconv.ParseFloat(strings.ReplaceAll(string(m[1]), ",", ""), 64)
	if err != nil {
		b.Fatal(err)
	}
	return rate
}
