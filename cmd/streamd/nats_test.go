package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// natsSub is a [[subscription]] named billing on key orders, with the TOML
// extra, forwarding to the subject orders.{key} of the NATS server at url.
func natsSub(url, extra string) string {
	return fmt.Sprintf(`
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
%s
[subscription.handler]
kind = "nats"
url = %q
subject = "orders.{key}"
timeout = "2s"
`, extra, url)
}

// TestNATSNoStream checks that when no JetStream stream captures the
// subject, check-config --handlers fails naming it, and streamd run starts
// all the same: the other subscriptions run, the subscription's deliveries
// are held (an ERROR names the subject), and go through once a stream
// captures it.
func TestNATSNoStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
	e := newEnv(t, natsSub(srv.URL(), `backoff = ["100ms"]`)+execSub("audit", "", "cat >/dev/null"))
	const want = `subject "orders.orders": no JetStream stream captures it`

	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "--handlers", "--config.file=" + e.config}, stdio{strings.NewReader(""), &out, &errOut}); code != exitError {
		t.Errorf("check-config --handlers: exit code %d, want %d", code, exitError)
	}
	if !strings.Contains(errOut.String(), `subscription "billing": nats handler: `+want) {
		t.Errorf("check-config --handlers: stderr %q does not say %q", errOut.String(), want)
	}

	e.publish("a")
	p := e.start()
	eventually(t, 30*time.Second, "the other subscription's delivery", func() bool { return len(e.deliveries()) == 1 })
	eventually(t, 30*time.Second, "the ERROR naming the subject, and the held record", func() bool {
		logged := strings.ReplaceAll(p.stderr.String(), `\"`, `"`)
		return strings.Contains(logged, want) && len(slogRecords(p.stderr.String(), holdMsgFirst)) == 1
	})
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	eventually(t, 30*time.Second, "the record in the stream created", func() bool { return len(srv.Messages("ORDERS")) == 1 })
	if code := p.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// natsRecords writes n records of key orders to path, with a record of
// another key every tenth: envelopes with text, binary and numbered
// headers, a plain payload every seventh, binary payloads of varied sizes.
func natsRecords(t *testing.T, path string, n int) {
	t.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{
		Create: true,
		Header: streamfile.Header{FileName: filepath.Base(path), CreatedAtMs: uint64(time.Now().UnixMilli()), BeaconInterval: 1024},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var frames []streamfile.Frame
	for i := range n {
		payload := make([]byte, rng.IntN(300))
		for j := range payload {
			payload[j] = byte(rng.Uint32())
		}
		if i%7 != 0 {
			payload = envelope.Encode(envelope.Headers{
				{Name: "content-type", Value: []byte("application/octet-stream")},
				{Name: "x-n", Value: strconv.AppendInt(nil, int64(i), 10)},
				{Name: "bin", Value: payload[:min(len(payload), 5)]},
				{Name: "we ird", Value: []byte(" spaced ")},
			}, payload, false)
		}
		frames = append(frames, streamfile.Frame{Key: "orders", Shard: uint64(i % 3), TimestampMs: uint64(1700000000000 + i), Payload: payload})
		if i%10 == 0 {
			frames = append(frames, streamfile.Frame{Key: "audit", TimestampMs: uint64(1700000000000 + i), Payload: []byte("other")})
		}
		if len(frames) >= 500 {
			if err := w.Publish(frames); err != nil {
				t.Fatal(err)
			}
			frames = frames[:0]
		}
	}
	if err := w.Publish(frames); err != nil {
		t.Fatal(err)
	}
}

// natsHeaders returns the record headers of a forwarded message, decoded
// from its Streamd-Header- and Streamd-Base64-Header- headers.
func natsHeaders(t *testing.T, h nats.Header) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, values := range h {
		if len(values) != 1 {
			t.Fatalf("header %s has %d values", name, len(values))
		}
		if rest, ok := strings.CutPrefix(name, "Streamd-Header-"); ok {
			out[unescapeName(t, rest)] = values[0]
		} else if rest, ok := strings.CutPrefix(name, "Streamd-Base64-Header-"); ok {
			v, err := base64.StdEncoding.DecodeString(values[0])
			if err != nil {
				t.Fatalf("header %s: %v", name, err)
			}
			out[unescapeName(t, rest)] = string(v)
		}
	}
	return out
}

// unescapeName undoes the %XX escapes of a header name.
func unescapeName(t *testing.T, s string) string {
	t.Helper()
	v, err := url.PathUnescape(s)
	if err != nil {
		t.Fatalf("header name %q: %v", s, err)
	}
	return v
}

// decodedRecord is a line of streamd decode --format=ndjson.
type decodedRecord struct {
	Key         string `json:"stream_key"`
	Shard       uint64 `json:"shard_id"`
	Seq         uint64 `json:"seq"`
	TimestampMs uint64 `json:"timestamp_ms"`
	Payload     []byte `json:"payload_b64"`
}

// decodeRecords runs streamd decode --format=ndjson on path and returns the
// records of key.
func decodeRecords(t *testing.T, path, key string) []decodedRecord {
	t.Helper()
	r := runBinary(t, nil, "decode", "--format=ndjson", path)
	if r.code != 0 {
		t.Fatalf("decode: %s", r.stderr)
	}
	var out []decodedRecord
	for line := range strings.Lines(r.stdout) {
		var d decodedRecord
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			t.Fatalf("decode line %q: %v", line, err)
		}
		if d.Key == key {
			out = append(out, d)
		}
	}
	return out
}

// checkForwarded checks that the stream holds each record of want exactly
// once and in order, with its headers, metadata and payload as decode
// shows them.
func checkForwarded(t *testing.T, msgs []jetstream.Msg, want []decodedRecord) {
	t.Helper()
	if len(msgs) != len(want) {
		t.Fatalf("the stream holds %d messages, want %d", len(msgs), len(want))
	}
	for i, m := range msgs {
		w := want[i]
		headers, payload := envelope.Decode(w.Payload)
		headers = headers.Clone()
		headers.SetSequence(w.Seq)
		wantHeaders := map[string]string{}
		for _, e := range headers {
			wantHeaders[e.Name] = string(e.Value)
		}
		meta := fmt.Sprintf("%s %s %s %s", m.Headers().Get("Streamd-Stream-Key"), m.Headers().Get("Streamd-Seq"), m.Headers().Get("Streamd-Shard"), m.Headers().Get("Streamd-Timestamp-Ms"))
		wantMeta := fmt.Sprintf("%s %s %s %s", w.Key, strconv.FormatUint(w.Seq, 10), strconv.FormatUint(w.Shard, 10), strconv.FormatUint(w.TimestampMs, 10))
		switch got := natsHeaders(t, m.Headers()); {
		case m.Subject() != "orders.orders":
			t.Fatalf("message %d: subject %q, want orders.orders", i, m.Subject())
		case meta != wantMeta:
			t.Fatalf("message %d: key, seq, shard and timestamp %q, want %q (out of order or missing)", i, meta, wantMeta)
		case !maps.Equal(got, wantHeaders):
			t.Fatalf("message %d (seq %d): headers %q, want %q", i, w.Seq, got, wantHeaders)
		case !bytes.Equal(m.Data(), payload):
			t.Fatalf("message %d (seq %d): payload %x, want %x", i, w.Seq, m.Data(), payload)
		}
	}
}

// TestNATSForward forwards records with concurrency 1, 2,000 one at a
// time (the 100,000 with STREAMD_LARGE_TESTS=1) and 2,000 in
// batches of 100: the stream holds each once, in file order, with its
// headers and payload as streamd decode shows them.
func TestNATSForward(t *testing.T) {
	t.Parallel()
	single := 2000
	if testutil.Large() {
		single = 100000
	}
	for _, tc := range []struct {
		name, handler string
		records       int
	}{
		{"one at a time", "", single},
		{"batches", "batch_max_records = 100\n", 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Start(t)
			st := srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
			e := newEnv(t, natsSub(srv.URL(), "")+tc.handler)
			natsRecords(t, e.stream, tc.records)
			p := e.start()
			eventually(t, 2*time.Minute, "every record in the stream", func() bool {
				info, err := st.Info(t.Context())
				return err == nil && info.State.Msgs >= uint64(tc.records)
			})
			if code := p.stop(t); code != 0 {
				t.Fatalf("streamd exited %d", code)
			}
			checkForwarded(t, srv.Messages("ORDERS"), decodeRecords(t, e.stream, "orders"))
		})
	}
}

// TestNATSTruncatedInPlace: a stream file truncated to its header and
// written again keeps its identity, so its new records sit where records
// already forwarded were; each is a message of its own, not taken by
// JetStream for a duplicate of the one that was there.
func TestNATSTruncatedInPlace(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	st := srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	holds := func(n uint64) func() bool {
		return func() bool {
			info, err := st.Info(t.Context())
			return err == nil && info.State.Msgs >= n
		}
	}
	e := newEnv(t, natsSub(srv.URL(), ""))
	e.publish("a0", "a1", "a2")
	p := e.start()
	eventually(t, 30*time.Second, "the first records in the stream", holds(3))
	if err := os.Truncate(e.stream, streamfile.HeaderSize); err != nil {
		t.Fatal(err)
	}
	// Records of the same sizes written before streamd looks would leave
	// the file as it was, and nothing to tell that it changed.
	eventually(t, 30*time.Second, "streamd to see the truncation", func() bool {
		return strings.Contains(p.stderr.String(), "stream file was truncated below the read position")
	})
	e.publish("b0", "b1", "b2")
	eventually(t, 30*time.Second, "the records written again in the stream", holds(6))
	if code := p.stop(t); code != 0 {
		t.Fatalf("streamd exited %d", code)
	}
	var got []string
	for _, m := range srv.Messages("ORDERS") {
		got = append(got, string(m.Data()))
	}
	if want := []string{"a0", "a1", "a2", "b0", "b1", "b2"}; !slices.Equal(got, want) {
		t.Errorf("the stream holds %q, want %q", got, want)
	}
}

// TestNATSOutage stops the NATS server while streamd forwards, and starts
// it again on its port with its store. While it is down the subscription
// is held: the held gauge is 1, failed deliveries are counted, the stream
// file gets no copy, nothing is dropped. The issue asks for 20 s of
// outage (with STREAMD_LARGE_TESTS=1, the outage lasts that long); two
// failed deliveries in a row prove the same in less. The second backoff
// step is an hour: the held record goes again because the client
// reconnected. When NATS is back, every record is in the stream exactly
// once, in order.
func TestNATSOutage(t *testing.T) {
	t.Parallel()
	const n = 3000
	srv := natstest.Start(t)
	st := srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	e := newEnv(t, natsSub(srv.URL(), `backoff = ["200ms", "1h"]`))
	metrics := e.withMetrics()
	natsRecords(t, e.stream, n)
	size := fileSize(t, e.stream)
	p := e.start()
	eventually(t, 30*time.Second, "500 messages in the stream", func() bool {
		info, err := st.Info(t.Context())
		return err == nil && info.State.Msgs >= 500
	})
	srv.Stop()
	stopped := time.Now()

	eventually(t, 10*time.Second, "the record to be held", gaugeIs(metrics, heldSeries("billing"), 1))
	eventually(t, 10*time.Second, "2 failed deliveries", func() bool {
		failed := 0.0
		for _, reason := range []string{"unreachable", "timeout"} {
			v, _ := scrapeGauge(metrics, failedSeries("billing", reason))
			failed += v
		}
		return failed >= 2
	})
	if got := fileSize(t, e.stream); got != size {
		t.Errorf("the stream file grew from %d to %d bytes during the outage", size, got)
	}
	for series, want := range map[string]float64{
		`streamd_handler_records_total{outcome="drop",subscription="billing"}`:        0,
		`streamd_handler_records_total{outcome="retry",subscription="billing"}`:       0,
		`streamd_handler_records_total{outcome="retry_after",subscription="billing"}`: 0,
	} {
		if got := metricValue(t, metrics, series); got != want {
			t.Errorf("%s = %v during the outage, want %v", series, got, want)
		}
	}

	if testutil.Large() {
		time.Sleep(time.Until(stopped.Add(20 * time.Second)))
	}
	srv.Restart()
	eventually(t, 2*time.Minute, "the last record to be committed", committedAtEnd(e, "billing"))
	eventually(t, 10*time.Second, "the held gauge to fall", gaugeIs(metrics, heldSeries("billing"), 0))
	if code := p.stop(t); code != 0 {
		t.Fatalf("streamd exited %d", code)
	}
	if got := fileSize(t, e.stream); got != size {
		t.Errorf("the stream file grew from %d to %d bytes", size, got)
	}
	checkForwarded(t, srv.Messages("ORDERS"), decodeRecords(t, e.stream, "orders"))
}

// TestNATSKill9 kills streamd with SIGKILL 10 times at random points while
// a producer appends and it forwards (200 to 800 ms after it runs), one run publishing each record on
// its own with concurrency 4, the next batches of up to 32 with
// concurrency 2, and so on: records acked by JetStream but not yet
// committed are published again by the next run, and JetStream's
// duplicate window (the default, 2 min) drops them. At the end the stream
// holds each record exactly once and nothing is missing, and the
// duplicate acknowledgements were counted. The issue asks for 20 kills;
// 10 keep make test fast (20 with STREAMD_LARGE_TESTS=1).
func TestNATSKill9(t *testing.T) {
	t.Parallel()
	kills := 10
	if testutil.Large() {
		kills = 20
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	srv := natstest.Start(t)
	st := srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	configs := []string{natsSub(srv.URL(), "concurrency = 4"), natsSub(srv.URL(), "concurrency = 2") + "batch_max_records = 32\nbatch_linger = \"20ms\"\n"}
	e := newEnv(t, configs[0])
	var metrics string
	prod := newCrashProducer(t, e.stream, 20)
	go prod.run(rand.New(rand.NewPCG(seed, 2)))
	stopProducer := sync.OnceFunc(func() { close(prod.stop); <-prod.done })
	defer stopProducer()

	duplicates := 0.0
	for i := range kills {
		e.writeConfig(configs[i%len(configs)])
		metrics = e.withMetrics()
		p := e.start()
		// A kill before it runs (a slow start on a busy machine) would
		// test nothing: the random point is in its forwarding.
		eventually(t, 30*time.Second, "the daemon to run", func() bool { return strings.Contains(p.stderr.String(), "streamd running") })
		time.Sleep(time.Duration(200+rng.IntN(601)) * time.Millisecond)
		if v, ok := scrapeGauge(metrics, `streamd_handler_duplicate_acks_total{subscription="billing"}`); ok {
			duplicates += v
		}
		p.kill9(t)
		if problems := p.crashProblems(); len(problems) > 0 {
			t.Errorf("run killed: %s", strings.Join(problems, "; "))
		}
	}
	stopProducer()
	if prod.err != nil {
		t.Fatalf("producer: %v", prod.err)
	}
	p := e.start()
	eventually(t, 60*time.Second, "the last record to be committed", committedAtEnd(e, "billing"))
	duplicates += metricValue(t, metrics, `streamd_handler_duplicate_acks_total{subscription="billing"}`)
	if code := p.stop(t); code != 0 {
		t.Fatalf("streamd exited %d", code)
	}
	if problems := p.crashProblems(); len(problems) > 0 {
		t.Errorf("last run: %s", strings.Join(problems, "; "))
	}

	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, m := range srv.Messages("ORDERS") {
		seen[string(m.Data())]++
		if m.Headers().Get("Streamd-Header-x-producer") != "crash" {
			t.Fatalf("message %q without the producer's header: %v", m.Data(), m.Headers())
		}
	}
	for i := range prod.count {
		if n := seen[fmt.Sprintf("p-%d", i)]; n != 1 {
			t.Errorf("record p-%d is %d times in the stream, want once", i, n)
		}
	}
	if info.State.Msgs != uint64(prod.count) || len(seen) != prod.count {
		t.Errorf("the stream holds %d messages (%d payloads), want %d", info.State.Msgs, len(seen), prod.count)
	}
	if duplicates == 0 {
		t.Errorf("no duplicate acknowledgement counted after %d kills", kills)
	}
	t.Logf("%d records, %d kills, %v duplicate acknowledgements counted", prod.count, kills, duplicates)
}

// TestNATSBatchStreamFull: JetStream acknowledges part of a batch and
// refuses the rest, its stream full (max_msgs, discard new). The records
// acknowledged are settled at once while the others are held: counted,
// committed, and the in-flight gauge counts the held ones alone. A kill -9
// during the hold does not publish them again (nothing is acknowledged
// twice, none is a duplicate); once the stream has room again, the held
// ones are published, each once.
func TestNATSBatchStreamFull(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	st := srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, MaxMsgs: 5, Discard: jetstream.DiscardNew})
	sub := natsSub(srv.URL(), `backoff = ["100ms"]`) + "batch_max_records = 10\nbatch_linger = \"100ms\"\n"
	e := newEnv(t, sub)
	metrics := e.withMetrics()
	var payloads []string
	for i := range 10 {
		payloads = append(payloads, fmt.Sprint("r", i+1))
	}
	e.publish(payloads...)
	series := func(outcome string) string {
		return fmt.Sprintf(`streamd_handler_records_total{outcome=%q,subscription="billing"}`, outcome)
	}
	inFlight := `streamd_subscription_records_in_flight{subscription="billing"}`
	p := e.start()
	eventually(t, 30*time.Second, "the records JetStream took acknowledged", gaugeIs(metrics, series("ack"), 5))
	eventually(t, 10*time.Second, "the refused records held", gaugeIs(metrics, heldSeries("billing"), 1))
	eventually(t, 10*time.Second, "the acknowledged records committed", committedThrough(e.stateDirPath(), "billing", 5))
	eventually(t, 10*time.Second, "the held records alone in flight", gaugeIs(metrics, inFlight, 5))
	p.kill9(t)
	if problems := p.crashProblems(); len(problems) > 0 {
		t.Errorf("run killed: %s", strings.Join(problems, "; "))
	}

	e.writeConfig(sub)
	metrics = e.withMetrics()
	p = e.start()
	eventually(t, 30*time.Second, "the refused records held again", func() bool {
		v, ok := scrapeGauge(metrics, series("failed"))
		return ok && v >= 10
	})
	eventually(t, 10*time.Second, "the held records alone in flight after the restart", gaugeIs(metrics, inFlight, 5))
	for name, want := range map[string]float64{series("ack"): 0, `streamd_handler_duplicate_acks_total{subscription="billing"}`: 0} {
		if got := metricValue(t, metrics, name); got != want {
			t.Errorf("%s = %v after the restart, want %v", name, got, want)
		}
	}
	if err := st.Purge(t.Context()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the last record to be committed", committedAtEnd(e, "billing"))
	if got := metricValue(t, metrics, series("ack")); got != 5 {
		t.Errorf("%v records acknowledged after the restart, want the 5 held", got)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("streamd exited %d", code)
	}
	var got []string
	for _, m := range srv.Messages("ORDERS") {
		got = append(got, string(m.Data()))
	}
	if want := payloads[5:]; !slices.Equal(got, want) {
		t.Errorf("the stream holds %q after the purge, want %q, each once", got, want)
	}
}

// TestReadmeNATS checks the README's nats configuration against a server
// with the stream it says to create: check-config --handlers passes.
func TestReadmeNATS(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: 5 * time.Minute})
	var block string
	for _, b := range readmeBlocks(t, "toml") {
		if strings.Contains(b, `kind = "nats"`) {
			block = b
		}
	}
	if block == "" {
		t.Fatal("README.md has no toml block with a nats handler")
	}
	var cfg strings.Builder
	for line := range strings.Lines(block) {
		switch {
		case strings.HasPrefix(line, "url = "):
			fmt.Fprintf(&cfg, "url = %q\n", srv.URL())
		case strings.HasPrefix(line, "creds_file = "): // the server asks for no credentials
		default:
			cfg.WriteString(line)
		}
	}
	e := newEnv(t, cfg.String())
	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "--handlers", "--config.file=" + e.config}, stdio{strings.NewReader(""), &out, &errOut}); code != exitOK {
		t.Fatalf("check-config --handlers on the README's configuration: exit code %d: %s", code, errOut.String())
	}
}
