package metrics

import "github.com/prometheus/client_golang/prometheus"

// StreamMetrics holds the series of one stream, labelled with its
// configured name. Its fields are cached label children: updating them
// looks nothing up. Get it from [Metrics.Stream].
type StreamMetrics struct {
	// Size is streamd_stream_size_bytes: the size of the stream file.
	Size prometheus.Gauge
	// WatchOverflows is streamd_watch_overflows_total.
	WatchOverflows prometheus.Counter
	// PollReads is streamd_poll_reads_total.
	PollReads prometheus.Counter

	m    *Metrics
	name string
}

// Stream returns the handle of the stream with the given configured name,
// creating its series at 0 if it has none. Calls with the same name return
// the same handle until it is removed.
func (m *Metrics) Stream(name string) *StreamMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.streams[name]; s != nil {
		return s
	}
	s := &StreamMetrics{
		Size:           m.streamSize.WithLabelValues(name),
		WatchOverflows: m.watchOverflows.WithLabelValues(name),
		PollReads:      m.pollReads.WithLabelValues(name),
		m:              m,
		name:           name,
	}
	m.streams[name] = s
	return s
}

// Remove deletes the stream's series, for a stream that a reload took
// away. The series of its subscriptions go with their own handles. Updates
// through the handle afterwards are not exposed. Removing a handle twice,
// or one that is no longer current, does nothing.
func (s *StreamMetrics) Remove() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.m.streams[s.name] != s {
		return
	}
	delete(s.m.streams, s.name)
	for _, v := range s.m.streamVecs {
		v.DeletePartialMatch(prometheus.Labels{labelStream: s.name})
	}
}

// SubscriptionMetrics holds the series of one subscription, labelled with
// its configured name (and its stream's, for the series of reading). Its
// fields are cached label children, the per-label ones in arrays indexed
// by [Reason], [Change], [Outcome] and [Operation]: updating them looks nothing up.
// Get it from [Metrics.Subscription].
type SubscriptionMetrics struct {
	// RecordsRead is streamd_records_read_total.
	RecordsRead prometheus.Counter
	// ReadBytes is streamd_read_bytes_total.
	ReadBytes prometheus.Counter
	// ReadErrors is streamd_read_errors_total, by reason.
	ReadErrors [numReasons]prometheus.Counter
	// FileChanges is streamd_stream_file_changes_total, by change.
	FileChanges [numChanges]prometheus.Counter
	// Position is streamd_stream_position_bytes: set it to the offset
	// committed to the sidecar.
	Position prometheus.Gauge
	// Lag is streamd_stream_lag_bytes: set it to the bytes the
	// subscription has yet to settle, across a rotation or a
	// copytruncate.
	Lag prometheus.Gauge
	// LastRecordTimestamp is streamd_stream_last_record_timestamp_seconds:
	// set it to the record's timestamp in seconds since the Unix epoch.
	LastRecordTimestamp prometheus.Gauge
	// HandlerRecords is streamd_handler_records_total, by outcome.
	HandlerRecords [numOutcomes]prometheus.Counter
	// Unsupported is streamd_handler_unsupported_total, by operation.
	Unsupported [numOperations]prometheus.Counter
	// HandlerDuration is streamd_handler_duration_seconds: observe seconds.
	HandlerDuration prometheus.Observer
	// RetriesScheduled is streamd_retries_scheduled_total.
	RetriesScheduled prometheus.Counter
	// RetriesAppended is streamd_retries_appended_total.
	RetriesAppended prometheus.Counter
	// LoopCopies is streamd_retry_loop_copies_total.
	LoopCopies prometheus.Counter
	// DeadLetters is streamd_dead_letters_total.
	DeadLetters prometheus.Counter
	// Rejects is streamd_rejects_total.
	Rejects prometheus.Counter
	// CopyErrors is streamd_copy_errors_total.
	CopyErrors prometheus.Counter
	// DuplicateAcks is streamd_handler_duplicate_acks_total.
	DuplicateAcks prometheus.Counter
	// Held is streamd_subscription_held: 1 while a failed delivery is held.
	Held prometheus.Gauge
	// InFlight is streamd_subscription_records_in_flight.
	InFlight prometheus.Gauge
	// OldestUnsettledAge is
	// streamd_subscription_oldest_unsettled_age_seconds: set it to seconds.
	OldestUnsettledAge prometheus.Gauge

	up     prometheus.Gauge
	health *healthState
	m      *Metrics
	name   string
	stream string
}

// Lookup returns the handle of the named subscription, nil when none was
// made or it was removed.
func (m *Metrics) Lookup(name string) *SubscriptionMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.subscriptions[name]
}

// FailedDeliveries is streamd_handler_failed_deliveries_total for one
// reason; the reasons are the caller's (the handlers' failure reasons).
// Call it for every reason when the subscription starts, so that each
// series exists at 0.
func (s *SubscriptionMetrics) FailedDeliveries(reason string) prometheus.Counter {
	return s.m.failed.WithLabelValues(s.name, reason)
}

// Subscription returns the handle of the subscription with the given
// configured name, reading the stream with the given configured name. A
// new handle creates every series of the subscription at 0, and the
// subscription is unhealthy ("starting") until
// [SubscriptionMetrics.SetHealthy] says otherwise. Calls with the same
// name and stream return the same handle until it is removed, so a reload
// can call Subscription for every configured subscription; a call with the
// same name and another stream removes the old handle first.
func (m *Metrics) Subscription(name, stream string) *SubscriptionMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.subscriptions[name]; s != nil {
		if s.stream == stream {
			return s
		}
		m.removeSubscription(s)
	}
	read := []string{stream, name}
	s := &SubscriptionMetrics{
		RecordsRead:         m.recordsRead.WithLabelValues(read...),
		ReadBytes:           m.readBytes.WithLabelValues(read...),
		Position:            m.position.WithLabelValues(read...),
		Lag:                 m.lag.WithLabelValues(read...),
		LastRecordTimestamp: m.lastRecord.WithLabelValues(read...),
		HandlerDuration:     m.handlerDuration.WithLabelValues(name),
		RetriesScheduled:    m.retriesScheduled.WithLabelValues(name),
		RetriesAppended:     m.retriesAppended.WithLabelValues(name),
		LoopCopies:          m.loopCopies.WithLabelValues(name),
		DeadLetters:         m.deadLetters.WithLabelValues(name),
		Rejects:             m.rejects.WithLabelValues(name),
		CopyErrors:          m.copyErrors.WithLabelValues(name),
		DuplicateAcks:       m.duplicateAcks.WithLabelValues(name),
		Held:                m.held.WithLabelValues(name),
		InFlight:            m.inFlight.WithLabelValues(name),
		OldestUnsettledAge:  m.oldestAge.WithLabelValues(name),
		up:                  m.up.WithLabelValues(name),
		health:              &healthState{reason: "starting"},
		m:                   m,
		name:                name,
		stream:              stream,
	}
	for r := range numReasons {
		s.ReadErrors[r] = m.readErrors.WithLabelValues(stream, name, r.String())
	}
	for c := range numChanges {
		s.FileChanges[c] = m.fileChanges.WithLabelValues(stream, name, c.String())
	}
	for o := range numOutcomes {
		s.HandlerRecords[o] = m.handlerRecords.WithLabelValues(name, o.String())
	}
	for o := range numOperations {
		s.Unsupported[o] = m.unsupported.WithLabelValues(name, o.String())
	}
	m.subscriptions[name] = s
	m.health.add(name, s.health)
	return s
}

// SetHealthy sets whether the subscription is healthy, with the reason
// when it is not (such as the error that stopped it): /healthz reports it
// and streamd_subscription_up follows it. It does nothing once the handle
// is removed.
func (s *SubscriptionMetrics) SetHealthy(ok bool, reason string) {
	if ok {
		reason = ""
	}
	s.m.health.set(s.health, ok, reason)
	if ok {
		s.up.Set(1)
	} else {
		s.up.Set(0)
	}
}

// Remove deletes the subscription's series and its health, for a
// subscription that a reload took away. Updates through the handle
// afterwards are not exposed. Removing a handle twice, or one that is no
// longer current, does nothing.
func (s *SubscriptionMetrics) Remove() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.m.subscriptions[s.name] == s {
		s.m.removeSubscription(s)
	}
}

// removeSubscription deletes the series and the health of s, the current
// handle of its name. m.mu is held.
func (m *Metrics) removeSubscription(s *SubscriptionMetrics) {
	delete(m.subscriptions, s.name)
	for _, v := range m.subscriptionVecs {
		v.DeletePartialMatch(prometheus.Labels{labelSubscription: s.name})
	}
	m.health.remove(s.name)
}
