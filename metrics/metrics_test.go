package metrics

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/version"
)

var update = flag.Bool("update", false, "rewrite testdata/names.golden")

const goldenNames = "testdata/names.golden"

// newTestMetrics returns the catalog on a pedantic registry, with one stream
// (orders) and one subscription (billing) reading it.
func newTestMetrics(t *testing.T) (*prometheus.Registry, *Metrics, *StreamMetrics, *SubscriptionMetrics) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := New(reg)
	sub := m.Subscription("billing", "orders")
	sub.FailedDeliveries("timeout") // the caller creates each reason
	return reg, m, m.Stream("orders"), sub
}

// count returns how many series of the family name g exposes.
func count(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	n, err := testutil.GatherAndCount(g, name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLint(t *testing.T) {
	tests := []struct {
		name string
		reg  func() prometheus.Gatherer
	}{
		{"pedantic registry with runtime collectors and handles", func() prometheus.Gatherer {
			reg := prometheus.NewPedanticRegistry()
			registerRuntime(reg)
			m := New(reg)
			m.Stream("orders")
			m.Stream("audit")
			m.Subscription("billing", "orders")
			m.Subscription("shipping", "orders").SetHealthy(true, "")
			m.Subscription("archive", "audit")
			return reg
		}},
		{"NewRegistry", func() prometheus.Gatherer {
			reg := NewRegistry()
			m := New(reg)
			m.Stream("orders")
			m.Subscription("billing", "orders")
			return reg
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			problems, err := testutil.GatherAndLint(tt.reg())
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Errorf("%s: %s", p.Metric, p.Text)
			}
		})
	}
}

// catalog lists the families the registry exposes, one a line: name, type
// and label names.
func catalog(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		fmt.Fprintf(&b, "%s %s", mf.GetName(), strings.ToLower(mf.GetType().String()))
		var labels []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		if len(labels) > 0 {
			fmt.Fprintf(&b, " %s", strings.Join(labels, ","))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestNames(t *testing.T) {
	reg, _, _, _ := newTestMetrics(t)
	got := catalog(t, reg)
	if *update {
		if err := os.WriteFile(goldenNames, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenNames)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the catalog differs from %s; if the change is meant (names are a stable interface: update doc.go too), run go test ./metrics -run TestNames -update\ngot:\n%s\nwant:\n%s", goldenNames, got, want)
	}
}

// TestNamesDocumented checks the table in doc.go against the registry:
// the same families, types and labels.
func TestNamesDocumented(t *testing.T) {
	reg, _, _, _ := newTestMetrics(t)
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^//\t\| (streamd_\w+) +\| (\w+) +\| ([a-z, ]*?) *\|`)
	var documented []string
	for _, m := range row.FindAllStringSubmatch(string(src), -1) {
		line := m[1] + " " + m[2]
		if m[3] != "" {
			labels := strings.Split(m[3], ", ") // the registry sorts label names
			slices.Sort(labels)
			line += " " + strings.Join(labels, ",")
		}
		documented = append(documented, line)
	}
	slices.Sort(documented)
	exposed := strings.Split(strings.TrimSuffix(catalog(t, reg), "\n"), "\n")
	if !slices.Equal(documented, exposed) {
		t.Errorf("the table in doc.go and the registry differ\ndoc.go:\n%s\nregistry:\n%s", strings.Join(documented, "\n"), strings.Join(exposed, "\n"))
	}
}

// TestPreinitialised checks that a stream and a subscription expose every
// label combination at once, at 0.
func TestPreinitialised(t *testing.T) {
	reg, _, _, _ := newTestMetrics(t)
	tests := []struct {
		name string
		want int
	}{
		{"streamd_records_read_total", 1},
		{"streamd_read_bytes_total", 1},
		{"streamd_read_errors_total", int(numReasons)},
		{"streamd_stream_file_changes_total", int(numChanges)},
		{"streamd_stream_size_bytes", 1},
		{"streamd_stream_position_bytes", 1},
		{"streamd_stream_lag_bytes", 1},
		{"streamd_stream_last_record_timestamp_seconds", 1},
		{"streamd_handler_records_total", int(numOutcomes)},
		{"streamd_handler_unsupported_total", int(numOperations)},
		{"streamd_handler_duration_seconds", 1},
		{"streamd_retries_scheduled_total", 1},
		{"streamd_retries_pending", 1},
		{"streamd_retries_appended_total", 1},
		{"streamd_retry_loop_copies_total", 1},
		{"streamd_dead_letters_total", 1},
		{"streamd_rejects_total", 1},
		{"streamd_copy_errors_total", 1},
		{"streamd_handler_duplicate_acks_total", 1},
		{"streamd_handler_failed_deliveries_total", 1},
		{"streamd_subscription_held", 1},
		{"streamd_subscription_records_in_flight", 1},
		{"streamd_subscription_oldest_unsettled_age_seconds", 1},
		{"streamd_subscription_up", 1},
		{"streamd_watch_overflows_total", 1},
		{"streamd_poll_reads_total", 1},
		{"streamd_offset_commits_total", 2},
		{"streamd_offset_commit_duration_seconds", 1},
		{"streamd_pipe_unsubscribed_lines_total", 1},
		{"streamd_config_last_reload_successful", 1},
		{"streamd_config_last_reload_success_timestamp_seconds", 1},
		{"streamd_build_info", 1},
	}
	for _, tt := range tests {
		if got := count(t, reg, tt.name); got != tt.want {
			t.Errorf("%s: %d series, want %d", tt.name, got, tt.want)
		}
	}
	if got, want := len(strings.Split(strings.TrimSpace(catalog(t, reg)), "\n")), len(tests); got != want {
		t.Errorf("the registry exposes %d families, the table checks %d", got, want)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue() + float64(s.GetHistogram().GetSampleCount())
			if mf.GetName() == "streamd_build_info" {
				v--
			}
			if v != 0 {
				t.Errorf("%s %v: %v, want 0", mf.GetName(), s.GetLabel(), v)
			}
		}
	}
}

// TestHandleFields checks that each field of a handle updates its own
// series, and for the enum arrays, the series with the enum's label value.
func TestHandleFields(t *testing.T) {
	_, m, st, sub := newTestMetrics(t)
	type row struct {
		name   string
		update func()
		series prometheus.Collector
	}
	read := []string{"orders", "billing"}
	tests := []row{
		{"Stream.Size", func() { st.Size.Set(1) }, m.streamSize.WithLabelValues("orders")},
		{"Stream.WatchOverflows", st.WatchOverflows.Inc, m.watchOverflows.WithLabelValues("orders")},
		{"Stream.PollReads", st.PollReads.Inc, m.pollReads.WithLabelValues("orders")},
		{"RecordsRead", sub.RecordsRead.Inc, m.recordsRead.WithLabelValues(read...)},
		{"ReadBytes", sub.ReadBytes.Inc, m.readBytes.WithLabelValues(read...)},
		{"Position", func() { sub.Position.Set(1) }, m.position.WithLabelValues(read...)},
		{"Lag", func() { sub.Lag.Set(1) }, m.lag.WithLabelValues(read...)},
		{"LastRecordTimestamp", func() { sub.LastRecordTimestamp.Set(1) }, m.lastRecord.WithLabelValues(read...)},
		{"RetriesScheduled", sub.RetriesScheduled.Inc, m.retriesScheduled.WithLabelValues("billing")},
		{"CountRetriesPending", func() { m.CountRetriesPending(func() int { return 1 }) }, m.retriesPending},
		{"RetriesAppended", sub.RetriesAppended.Inc, m.retriesAppended.WithLabelValues("billing")},
		{"LoopCopies", sub.LoopCopies.Inc, m.loopCopies.WithLabelValues("billing")},
		{"DeadLetters", sub.DeadLetters.Inc, m.deadLetters.WithLabelValues("billing")},
		{"Rejects", sub.Rejects.Inc, m.rejects.WithLabelValues("billing")},
		{"CopyErrors", sub.CopyErrors.Inc, m.copyErrors.WithLabelValues("billing")},
		{"DuplicateAcks", sub.DuplicateAcks.Inc, m.duplicateAcks.WithLabelValues("billing")},
		{"SetHealthy", func() { sub.SetHealthy(true, "") }, m.up.WithLabelValues("billing")},
	}
	for r := range numReasons {
		tests = append(tests, row{"ReadErrors/" + r.String(), sub.ReadErrors[r].Inc, m.readErrors.WithLabelValues("orders", "billing", r.String())})
	}
	for c := range numChanges {
		tests = append(tests, row{"FileChanges/" + c.String(), sub.FileChanges[c].Inc, m.fileChanges.WithLabelValues("orders", "billing", c.String())})
	}
	for o := range numOutcomes {
		tests = append(tests, row{"HandlerRecords/" + o.String(), sub.HandlerRecords[o].Inc, m.handlerRecords.WithLabelValues("billing", o.String())})
	}
	for o := range numOperations {
		tests = append(tests, row{"Unsupported/" + o.String(), sub.Unsupported[o].Inc, m.unsupported.WithLabelValues("billing", o.String())})
	}
	for _, tt := range tests {
		tt.update()
		if got := testutil.ToFloat64(tt.series); got != 1 {
			t.Errorf("%s: the series is %v, want 1", tt.name, got)
		}
	}

	sub.HandlerDuration.Observe(0.002)
	if err := testutil.CollectAndCompare(m.handlerDuration, strings.NewReader(histogramText(
		"streamd_handler_duration_seconds", "Time the subscription's handler took per delivery, or per batch.",
		`subscription="billing"`, handlerBuckets, 0.002)), "streamd_handler_duration_seconds"); err != nil {
		t.Error(err)
	}
}

// histogramText returns the exposition of a histogram that observed v once.
func histogramText(name, help, labels string, buckets []float64, v float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	sep := ""
	if labels != "" {
		sep = ","
	}
	for _, le := range buckets {
		n := 0
		if v <= le {
			n = 1
		}
		fmt.Fprintf(&b, "%s_bucket{%s%sle=\"%g\"} %d\n", name, labels, sep, le, n)
	}
	fmt.Fprintf(&b, "%s_bucket{%s%sle=\"+Inf\"} 1\n", name, labels, sep)
	if labels != "" {
		labels = "{" + labels + "}"
	}
	fmt.Fprintf(&b, "%s_sum%s %g\n%s_count%s 1\n", name, labels, v, name, labels)
	return b.String()
}

func TestEnumStrings(t *testing.T) {
	tests := []struct {
		v    fmt.Stringer
		want string
	}{
		{ReasonChecksum, "checksum"},
		{ReasonFormat, "format"},
		{ReasonLost, "lost"},
		{ReasonRemoval, "removal"},
		{ReasonTornTail, "torn_tail"},
		{ReasonOverflow, "overflow"},
		{ReasonInvalidLine, "invalid_line"},
		{ReasonUnreadable, "unreadable"},
		{numReasons, "Reason(8)"},
		{ChangeReplaced, "replaced"},
		{ChangeRemoved, "removed"},
		{ChangeTruncated, "truncated"},
		{numChanges, "Change(3)"},
		{Reason(-1), "Reason(-1)"},
		{OutcomeAck, "ack"},
		{OutcomeDrop, "drop"},
		{OutcomeRetry, "retry"},
		{OutcomeRetryAfter, "retry_after"},
		{OutcomeFailed, "failed"},
		{OutcomeForeignCopy, "foreign_copy"},
		{OutcomeDecodeError, "decode_error"},
		{OutcomePanic, "panic"},
		{numOutcomes, "Outcome(8)"},
		{OperationAck, "ack"},
		{OperationDrop, "drop"},
		{OperationRetry, "retry"},
		{OperationReject, "reject"},
		{numOperations, "Operation(4)"},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("%T(%d).String() = %q, want %q", tt.v, tt.v, got, tt.want)
		}
	}
}

func TestSubscriptionRemove(t *testing.T) {
	reg, m, _, billing := newTestMetrics(t)
	audit := m.Subscription("audit", "orders")
	audit.SetHealthy(true, "")
	billing.HandlerRecords[OutcomeAck].Inc()

	billing.Remove()
	tests := []struct {
		name string
		want int
	}{
		{"streamd_records_read_total", 1},
		{"streamd_read_errors_total", int(numReasons)},
		{"streamd_stream_position_bytes", 1},
		{"streamd_stream_lag_bytes", 1},
		{"streamd_handler_records_total", int(numOutcomes)},
		{"streamd_handler_unsupported_total", int(numOperations)},
		{"streamd_handler_duration_seconds", 1},
		{"streamd_subscription_up", 1},
		{"streamd_retries_pending", 1},   // the whole spool's
		{"streamd_stream_size_bytes", 1}, // the stream stays
	}
	for _, tt := range tests {
		if got := count(t, reg, tt.name); got != tt.want {
			t.Errorf("after Remove, %s: %d series, want %d (audit's)", tt.name, got, tt.want)
		}
	}
	if got := catalog(t, reg); strings.Contains(got, "billing") {
		t.Errorf("billing is still exposed:\n%s", got)
	}
	if err := m.Health().Err(); err != nil {
		t.Errorf("health after Remove: %v", err)
	}

	// A removed handle changes nothing, and removing it again is harmless.
	billing.SetHealthy(false, "stopped")
	billing.HandlerRecords[OutcomeAck].Inc()
	billing.Remove()
	if err := m.Health().Err(); err != nil {
		t.Errorf("health after SetHealthy on a removed handle: %v", err)
	}

	// A subscription of the same name starts again from 0.
	again := m.Subscription("billing", "orders")
	if again == billing {
		t.Fatal("Subscription returned the removed handle")
	}
	if got := testutil.ToFloat64(m.handlerRecords.WithLabelValues("billing", "ack")); got != 0 {
		t.Errorf("new handle: ack = %v, want 0", got)
	}
	if got := count(t, reg, "streamd_handler_records_total"); got != 2*int(numOutcomes) {
		t.Errorf("new handle: %d outcome series, want %d", got, 2*int(numOutcomes))
	}
}

func TestSubscriptionAgain(t *testing.T) {
	reg, m, _, billing := newTestMetrics(t)
	billing.RecordsRead.Add(3)

	if got := m.Subscription("billing", "orders"); got != billing {
		t.Error("same name and stream: got a new handle")
	}
	if got := testutil.ToFloat64(m.recordsRead.WithLabelValues("orders", "billing")); got != 3 {
		t.Errorf("same name and stream: records read = %v, want 3", got)
	}

	moved := m.Subscription("billing", "audit")
	if moved == billing {
		t.Fatal("another stream: got the old handle")
	}
	if got := testutil.ToFloat64(m.recordsRead.WithLabelValues("audit", "billing")); got != 0 {
		t.Errorf("another stream: records read = %v, want 0", got)
	}
	if got := count(t, reg, "streamd_records_read_total"); got != 1 {
		t.Errorf("another stream: %d records read series, want 1 (the old one is removed)", got)
	}
	billing.Remove() // no longer current: must not remove the new handle's series
	if got := count(t, reg, "streamd_read_errors_total"); got != int(numReasons) {
		t.Errorf("after removing the old handle: %d read error series, want %d", got, numReasons)
	}
	if err := m.Health().Err(); err == nil || !strings.Contains(err.Error(), `"billing": starting`) {
		t.Errorf("health of the new handle: %v", err)
	}
}

func TestStreamRemove(t *testing.T) {
	reg, m, orders, _ := newTestMetrics(t)
	audit := m.Stream("audit")
	if m.Stream("orders") != orders {
		t.Error("same name: got a new handle")
	}
	orders.Remove()
	orders.Remove()
	for _, name := range []string{"streamd_stream_size_bytes", "streamd_watch_overflows_total", "streamd_poll_reads_total"} {
		if got := count(t, reg, name); got != 1 {
			t.Errorf("%s: %d series, want 1 (audit's)", name, got)
		}
	}
	if got := count(t, reg, "streamd_records_read_total"); got != 1 {
		t.Errorf("the subscription's series went with the stream: %d, want 1", got)
	}
	audit.Size.Set(5)
	if got := testutil.ToFloat64(m.streamSize.WithLabelValues("audit")); got != 5 {
		t.Errorf("audit size = %v, want 5", got)
	}
}

func TestObserveCommit(t *testing.T) {
	reg, m, _, _ := newTestMetrics(t)
	m.ObserveCommit(3*time.Millisecond, nil)
	m.ObserveCommit(2*time.Millisecond, nil)
	m.ObserveCommit(time.Second, errors.New("offsets: disk full"))
	tests := []struct {
		name      string
		got, want float64
	}{
		{"success", testutil.ToFloat64(m.commitSuccess), 2},
		{"failure", testutil.ToFloat64(m.commitFailure), 1},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	count, sum := histogram(t, reg, "streamd_offset_commit_duration_seconds")
	if count != 3 || math.Abs(sum-1.005) > 1e-9 {
		t.Errorf("commit duration: count %d, sum %v; want 3, 1.005", count, sum)
	}
}

// histogram returns the sample count and sum of the histogram name.
func histogram(t *testing.T, g prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("%s is not exposed", name)
	return 0, 0
}

func TestObserveReload(t *testing.T) {
	_, m, _, _ := newTestMetrics(t)
	t1 := time.Unix(1700000000, 500_000_000)
	t2 := t1.Add(time.Minute)
	tests := []struct {
		name          string
		at            time.Time
		err           error
		wantOK, wantT float64
	}{
		{"first load", t1, nil, 1, 1700000000.5},
		{"failed reload keeps the last success", t2, errors.New("config: bad"), 0, 1700000000.5},
		{"successful reload", t2, nil, 1, 1700000060.5},
	}
	for _, tt := range tests {
		m.ObserveReload(tt.at, tt.err)
		ok, ts := testutil.ToFloat64(m.reloadSuccessful), testutil.ToFloat64(m.reloadTimestamp)
		if ok != tt.wantOK || ts != tt.wantT {
			t.Errorf("%s: successful %v, timestamp %v; want %v, %v", tt.name, ok, ts, tt.wantOK, tt.wantT)
		}
	}
}

// TestBuildInfo checks streamd_build_info says what the version package
// holds, which the Makefile sets at link time.
func TestBuildInfo(t *testing.T) {
	saved := version.Version
	t.Cleanup(func() { version.Version = saved })
	version.Version = "1.2.3"
	reg := prometheus.NewPedanticRegistry()
	New(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, mf := range mfs {
		if mf.GetName() == "streamd_build_info" {
			for _, l := range mf.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
		}
	}
	if labels["version"] != "1.2.3" || labels["goversion"] != runtime.Version() || labels["goarch"] != runtime.GOARCH {
		t.Errorf("streamd_build_info labels %v, want version 1.2.3, goversion %s and goarch %s", labels, runtime.Version(), runtime.GOARCH)
	}
}

// TestHotPathAllocs checks that updating a handle allocates nothing.
func TestHotPathAllocs(t *testing.T) {
	_, m, st, sub := newTestMetrics(t)
	allocs := testing.AllocsPerRun(100, func() {
		sub.RecordsRead.Add(1)
		sub.ReadBytes.Add(512)
		sub.ReadErrors[ReasonChecksum].Inc()
		sub.HandlerRecords[OutcomeAck].Inc()
		sub.Unsupported[OperationAck].Inc()
		sub.HandlerDuration.Observe(0.004)
		sub.LastRecordTimestamp.Set(1700000000.5)
		sub.Position.Set(4096)
		st.Size.Set(8192)
		m.ObserveCommit(time.Millisecond, nil)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per update, want 0", allocs)
	}
}

// TestConcurrentUse runs handles, reloads and scrapes at once, for the race
// detector.
func TestConcurrentUse(t *testing.T) {
	reg, m, _, billing := newTestMetrics(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 200 {
			billing.HandlerRecords[OutcomeAck].Inc()
			billing.SetHealthy(true, "")
		}
	})
	wg.Go(func() {
		for i := range 200 {
			s := m.Subscription("audit", "orders")
			s.SetHealthy(i%2 == 0, "stopped")
			m.Stream("audit").PollReads.Inc()
			if i%3 == 0 {
				s.Remove()
				m.Stream("audit").Remove()
			}
		}
	})
	wg.Go(func() {
		for range 50 {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
				return
			}
			_ = m.Health().Err()
		}
	})
	wg.Wait()
}

// TestHealthProblems: a problem of the whole daemon makes /healthz
// unhealthy before the subscriptions' own reasons, until it is cleared.
func TestHealthProblems(t *testing.T) {
	_, m, _, sub := newTestMetrics(t)
	sub.SetHealthy(true, "")
	h := m.Health()
	if err := h.Err(); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	if h.SetProblem("positions", "committing them to the sidecar fails: disk full") {
		t.Error("SetProblem reports a problem before the first")
	}
	sub.SetHealthy(false, "its copies cannot be written")
	want := "positions: committing them to the sidecar fails: disk full\n" + `subscription "billing": its copies cannot be written`
	if err := h.Err(); err == nil || err.Error() != want {
		t.Errorf("Err() = %v, want %q", err, want)
	}
	if !h.SetProblem("positions", "") || h.SetProblem("positions", "") {
		t.Error("clearing the problem does not report it once")
	}
	sub.SetHealthy(true, "")
	if err := h.Err(); err != nil {
		t.Errorf("after both passed: %v", err)
	}
}
