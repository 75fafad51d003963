package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

const namespace = "streamd"

// The label names.
const (
	labelStream       = "stream"
	labelSubscription = "subscription"
	labelReason       = "reason"
	labelChange       = "change"
	labelOutcome      = "outcome"
	labelOperation    = "operation"
	labelResult       = "result"
)

var (
	// handlerBuckets span 1 ms to about 33 s: a local HTTP call or a
	// process start at the low end, handler timeouts at the high end.
	handlerBuckets = prometheus.ExponentialBuckets(0.001, 2, 16)
	// commitBuckets are etcd's WAL fsync buckets, 1 ms to about 8 s.
	commitBuckets = prometheus.ExponentialBuckets(0.001, 2, 14)
)

// NewRegistry returns a registry with the Go runtime and process
// collectors registered, for [New] and [NewServer].
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	registerRuntime(reg)
	return reg
}

// registerRuntime registers the Go runtime and process collectors.
func registerRuntime(reg prometheus.Registerer) {
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
}

// Metrics is streamd's metric catalog (see the package documentation).
// Its methods and the handles it returns are safe for concurrent use.
type Metrics struct {
	health *Health

	// Per stream.
	streamSize     *prometheus.GaugeVec
	watchOverflows *prometheus.CounterVec
	pollReads      *prometheus.CounterVec

	// Per subscription.
	recordsRead      *prometheus.CounterVec
	readBytes        *prometheus.CounterVec
	readErrors       *prometheus.CounterVec
	fileChanges      *prometheus.CounterVec
	position         *prometheus.GaugeVec
	lag              *prometheus.GaugeVec
	lastRecord       *prometheus.GaugeVec
	handlerRecords   *prometheus.CounterVec
	unsupported      *prometheus.CounterVec
	handlerDuration  *prometheus.HistogramVec
	retriesScheduled *prometheus.CounterVec
	retriesPending   prometheus.GaugeFunc
	pendingFn        atomic.Pointer[func() int] // what retriesPending reads
	retriesAppended  *prometheus.CounterVec
	loopCopies       *prometheus.CounterVec
	deadLetters      *prometheus.CounterVec
	rejects          *prometheus.CounterVec
	copyErrors       *prometheus.CounterVec
	duplicateAcks    *prometheus.CounterVec
	failed           *prometheus.CounterVec
	held             *prometheus.GaugeVec
	inFlight         *prometheus.GaugeVec
	oldestAge        *prometheus.GaugeVec
	up               *prometheus.GaugeVec

	streamVecs, subscriptionVecs []*prometheus.MetricVec

	commitSuccess    prometheus.Counter
	commitFailure    prometheus.Counter
	commitDuration   prometheus.Histogram
	reloadSuccessful prometheus.Gauge
	reloadTimestamp  prometheus.Gauge

	unsubscribedLines prometheus.Counter

	mu            sync.Mutex
	streams       map[string]*StreamMetrics
	subscriptions map[string]*SubscriptionMetrics
}

// New creates the catalog and registers it with reg; a nil reg registers
// nothing. It panics, as [prometheus.Registerer.MustRegister] does, if reg
// already holds metrics of the same names. The process-wide series
// (commits, config reload, build info) start at once; per-stream and
// per-subscription series start when [Metrics.Stream] and
// [Metrics.Subscription] create their handles.
func New(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	streamLabels := []string{labelStream}
	readLabels := []string{labelStream, labelSubscription}
	subLabels := []string{labelSubscription}
	failureLabels := []string{labelSubscription, labelReason} // the handlers' failure reasons
	m := &Metrics{
		health: &Health{subscriptions: make(map[string]*healthState)},

		streamSize: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "stream_size_bytes",
			Help: "Size of the stream file, as last seen by its readers.",
		}, streamLabels),
		watchOverflows: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "watch_overflows_total",
			Help: "Overflows of the file notification queue while following the stream file.",
		}, streamLabels),
		pollReads: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "poll_reads_total",
			Help: "Changes of the stream file found by polling rather than by a notification.",
		}, streamLabels),

		recordsRead: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "records_read_total",
			Help: "Records read for the subscription.",
		}, readLabels),
		readBytes: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "read_bytes_total",
			Help: "Bytes of the stream file read for the subscription.",
		}, readLabels),
		readErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "read_errors_total",
			Help: "Problems met while reading for the subscription, by reason.",
		}, []string{labelStream, labelSubscription, labelReason}),
		fileChanges: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "stream_file_changes_total",
			Help: "Changes of the file at the stream's path that the subscription's reader went through (rotations), by change.",
		}, []string{labelStream, labelSubscription, labelChange}),
		position: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "stream_position_bytes",
			Help: "Committed position of the subscription in the stream file.",
		}, readLabels),
		lag: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "stream_lag_bytes",
			Help: "Bytes the subscription has yet to settle: the rest of the file it reads, of the files rotated after it, and of the file at the path.",
		}, readLabels),
		lastRecord: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "stream_last_record_timestamp_seconds",
			Help: "Timestamp of the last record read for the subscription, 0 before the first.",
		}, readLabels),
		handlerRecords: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "handler_records_total",
			Help: "Deliveries of the subscription, by outcome.",
		}, []string{labelSubscription, labelOutcome}),
		unsupported: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "handler_unsupported_total",
			Help: "Settlements the transport cannot perform, by operation.",
		}, []string{labelSubscription, labelOperation}),
		handlerDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "handler_duration_seconds",
			Help:    "Time the subscription's handler took per delivery, or per batch.",
			Buckets: handlerBuckets,
		}, subLabels),
		retriesScheduled: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "retries_scheduled_total",
			Help: "Delayed retry copies put in the retry spool.",
		}, subLabels),

		retriesAppended: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "retries_appended_total",
			Help: "Retry copies written to their destination.",
		}, subLabels),
		loopCopies: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "retry_loop_copies_total",
			Help: "Retry copies of records past their 100th attempt under no max_attempts: a handler that retries records for good.",
		}, subLabels),
		deadLetters: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "dead_letters_total",
			Help: "Copies written to the dead-letter key.",
		}, subLabels),
		rejects: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "rejects_total",
			Help: "Deliveries rejected at the retry cap with no dead-letter key.",
		}, subLabels),
		copyErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "copy_errors_total",
			Help: "Retry or dead-letter copies that could not be written.",
		}, subLabels),
		duplicateAcks: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "handler_duplicate_acks_total",
			Help: "Acknowledgements of records the destination already held (JetStream duplicates), counted in the acks too.",
		}, subLabels),
		failed: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "handler_failed_deliveries_total",
			Help: "Deliveries that failed (the handler could not decide) and were tried again in place, by reason.",
		}, failureLabels),
		held: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "subscription_held",
			Help: "Whether a delivery of the subscription failed and is held, to be tried again in place (1) or not (0).",
		}, subLabels),
		inFlight: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "subscription_records_in_flight",
			Help: "Records of the subscription handed to the handler and not settled yet.",
		}, subLabels),
		oldestAge: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "subscription_oldest_unsettled_age_seconds",
			Help: "Age of the subscription's oldest record handed to the handler and not settled yet, 0 when none is.",
		}, subLabels),
		up: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "subscription_up",
			Help: "Whether the subscription is healthy (1) or not (0).",
		}, subLabels),

		commitDuration: f.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "offset_commit_duration_seconds",
			Help:    "Time a commit of the positions to the sidecar took, fsyncs included.",
			Buckets: commitBuckets,
		}),
		reloadSuccessful: f.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "config_last_reload_successful",
			Help: "Whether the last configuration load or reload succeeded (1) or not (0).",
		}),
		reloadTimestamp: f.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "config_last_reload_success_timestamp_seconds",
			Help: "Timestamp of the last successful configuration load or reload.",
		}),

		unsubscribedLines: f.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "pipe_unsubscribed_lines_total",
			Help: "Lines of streamd pipe's stdin with a key no subscription reads, dropped.",
		}),

		streams:       make(map[string]*StreamMetrics),
		subscriptions: make(map[string]*SubscriptionMetrics),
	}
	commits := f.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "offset_commits_total",
		Help: "Commits of the positions to the sidecar, by result.",
	}, []string{labelResult})
	m.commitSuccess = commits.WithLabelValues(resultSuccess)
	m.commitFailure = commits.WithLabelValues(resultFailure)

	if reg != nil {
		// streamd_build_info, with the labels of every Prometheus exporter:
		// what github.com/prometheus/common/version holds.
		reg.MustRegister(versioncollector.NewCollector(namespace))
	}

	m.streamVecs = []*prometheus.MetricVec{m.streamSize.MetricVec, m.watchOverflows.MetricVec, m.pollReads.MetricVec}
	m.subscriptionVecs = []*prometheus.MetricVec{
		m.recordsRead.MetricVec, m.readBytes.MetricVec, m.readErrors.MetricVec, m.fileChanges.MetricVec,
		m.position.MetricVec, m.lag.MetricVec, m.lastRecord.MetricVec,
		m.handlerRecords.MetricVec, m.unsupported.MetricVec, m.handlerDuration.MetricVec,
		m.retriesScheduled.MetricVec, m.retriesAppended.MetricVec, m.loopCopies.MetricVec,
		m.deadLetters.MetricVec, m.rejects.MetricVec, m.copyErrors.MetricVec, m.failed.MetricVec,
		m.duplicateAcks.MetricVec,
		m.held.MetricVec, m.inFlight.MetricVec, m.oldestAge.MetricVec, m.up.MetricVec,
	}
	m.retriesPending = f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "retries_pending",
		Help: "Delayed retry copies of every subscription waiting in the retry queue.",
	}, func() float64 {
		if fn := m.pendingFn.Load(); fn != nil {
			return float64((*fn)())
		}
		return 0
	})
	return m
}

// CountUnsubscribedLine counts a line of streamd pipe's stdin whose key no
// subscription reads.
func (m *Metrics) CountUnsubscribedLine() { m.unsubscribedLines.Inc() }

// Health returns the health of the subscriptions that have handles, for
// [NewServer].
func (m *Metrics) Health() *Health { return m.health }

// ObserveCommit counts one commit of the positions to the sidecar, failed
// when err is not nil, and observes how long it took (failed commits
// included).
func (m *Metrics) ObserveCommit(d time.Duration, err error) {
	if err != nil {
		m.commitFailure.Inc()
	} else {
		m.commitSuccess.Inc()
	}
	m.commitDuration.Observe(d.Seconds())
}

// CountRetriesPending makes streamd_retries_pending read pending at each
// scrape: the number of delayed copies waiting in the retry queue.
func (m *Metrics) CountRetriesPending(pending func() int) { m.pendingFn.Store(&pending) }

// ObserveReload records a configuration load or reload that ended at the
// given time, failed when err is not nil. Call it for the first load too.
// A failure leaves the timestamp of the last success as it was.
func (m *Metrics) ObserveReload(at time.Time, err error) {
	if err != nil {
		m.reloadSuccessful.Set(0)
		return
	}
	m.reloadSuccessful.Set(1)
	m.reloadTimestamp.Set(float64(at.UnixNano()) / 1e9)
}
