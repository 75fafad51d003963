// Package metrics is streamd's Prometheus instrumentation: the metric
// catalog, its registry, and the HTTP listener that serves /metrics and
// /healthz.
//
// # Usage
//
//	reg := metrics.NewRegistry()                 // Go runtime and process collectors
//	m := metrics.New(reg)                        // the catalog, and streamd_build_info
//	m.ObserveReload(time.Now(), err)             // after the first load, and after each reload
//	st := m.Stream("orders")                     // per configured stream
//	sub := m.Subscription("billing", "orders")   // per configured subscription
//	sub.SetHealthy(true, "")                     // once it runs; SetHealthy(false, err.Error()) when it stops
//
//	srv := metrics.NewServer(cfg.Metrics.Listen, cfg.Metrics.WebConfigFile, reg, m.Health(), logger)
//	if err := srv.Listen(); err != nil {         // before READY=1: a bad address fails the start
//		return err
//	}
//	wg.Go(func() { errc <- srv.Run(ctx) })       // serves until ctx is done, then shuts down
//
// On hot paths, update the fields of the handles; they are cached label
// children, so nothing is looked up or allocated:
//
//	sub.RecordsRead.Add(float64(records))
//	sub.ReadBytes.Add(float64(bytes))
//	sub.ReadErrors[metrics.ReasonChecksum].Inc()
//	sub.HandlerRecords[metrics.OutcomeAck].Inc()
//	sub.Unsupported[metrics.OperationAck].Inc()
//	sub.HandlerDuration.Observe(time.Since(start).Seconds())
//	sub.LastRecordTimestamp.Set(float64(timestampMs) / 1000)
//	sub.Position.Set(float64(committedOffset))  // after each commit
//	st.Size.Set(float64(size))
//	m.ObserveCommit(time.Since(start), err)
//
// A handle creates all its series at 0, for every value of its enum
// labels, so that rates and alerts work before the first event. On
// reload, call [Metrics.Stream] and [Metrics.Subscription] for every
// configured stream and subscription (those that stay get their handles
// back, counters intact) and Remove the handles of those that went; their
// series and health go with them, as Prometheus's WAL watcher deletes its
// series on Stop.
//
// # Health
//
// A subscription with a handle is unhealthy ("starting") until
// [SubscriptionMetrics.SetHealthy] marks it healthy; when it cannot do its
// work (it stopped on a corrupt frame or a fatal error, its stream file
// cannot be read, its copies cannot be written), SetHealthy(false,
// reason) says why. A problem of the whole daemon, such as commits of the
// positions that fail, is set with [Health.SetProblem]. /healthz answers
// 200 "ok" while there is no problem and every subscription with a handle
// is healthy, and 503 otherwise, with one line per problem, then per
// unhealthy subscription:
//
//	positions: committing them to the sidecar fails: no space left on device
//	subscription "billing": starting
//	subscription "audit": streamfile: checksum mismatch at offset 4096
//
// A handler that is down is not the daemon's failure: a held delivery
// leaves the subscription healthy, and streamd_subscription_held says it.
//
// # Catalog
//
// Names are stable: metrics/testdata/names.golden lists each family with
// its type and labels, and a test compares it with what the registry
// exposes (go test ./metrics -update rewrites it). Labels are bounded:
// stream and subscription are configured names, never paths or stream
// keys; reason, change, outcome, operation and result are the enums below. Units
// are seconds and bytes; timestamps are seconds since the Unix epoch, 0
// before the first event.
//
//	| name                                                 | type      | labels                       | meaning                                                                    |
//	| ---------------------------------------------------- | --------- | ---------------------------- | -------------------------------------------------------------------------- |
//	| streamd_records_read_total                           | counter   | stream, subscription         | records read for the subscription                                          |
//	| streamd_read_bytes_total                             | counter   | stream, subscription         | bytes of the stream file read for it (frames and the beacons between them) |
//	| streamd_read_errors_total                            | counter   | stream, subscription, reason | problems met while reading for it, by Reason                               |
//	| streamd_stream_file_changes_total                    | counter   | stream, subscription, change | changes of the file at the path its reader went through, by Change         |
//	| streamd_stream_size_bytes                            | gauge     | stream                       | size of the stream file                                                    |
//	| streamd_stream_position_bytes                        | gauge     | stream, subscription         | position committed to the sidecar                                          |
//	| streamd_stream_lag_bytes                             | gauge     | stream, subscription         | bytes it has yet to settle, across a rotation or a copytruncate            |
//	| streamd_stream_last_record_timestamp_seconds         | gauge     | stream, subscription         | timestamp of the last record read for it                                   |
//	| streamd_handler_records_total                        | counter   | subscription, outcome        | deliveries, by Outcome                                                     |
//	| streamd_handler_unsupported_total                    | counter   | subscription, operation      | settlements the transport cannot perform, by Operation                     |
//	| streamd_handler_duration_seconds                     | histogram | subscription                 | time the handler took per delivery or batch (buckets 1 ms to 32.8 s, x2)   |
//	| streamd_retries_scheduled_total                      | counter   | subscription                 | delayed retry copies put in the retry spool                                |
//	| streamd_retries_pending                              | gauge     |                              | delayed retry copies of every subscription waiting in the retry queue      |
//	| streamd_retries_appended_total                       | counter   | subscription                 | retry copies written to their destination                                  |
//	| streamd_retry_loop_copies_total                      | counter   | subscription                 | retry copies of records past their 100th attempt under no max_attempts     |
//	| streamd_dead_letters_total                           | counter   | subscription                 | copies written to the dead-letter key                                      |
//	| streamd_rejects_total                                | counter   | subscription                 | deliveries rejected at the retry cap with no dead-letter key               |
//	| streamd_copy_errors_total                            | counter   | subscription                 | retry or dead-letter copies that could not be written                      |
//	| streamd_handler_failed_deliveries_total              | counter   | subscription, reason         | deliveries that failed and were tried again in place, by handler reason    |
//	| streamd_handler_duplicate_acks_total                 | counter   | subscription                 | acks of records the destination already held (JetStream duplicates)       |
//	| streamd_subscription_held                            | gauge     | subscription                 | 1 while a failed delivery is held and tried again in place                 |
//	| streamd_subscription_records_in_flight               | gauge     | subscription                 | records handed to the handler and not settled yet                          |
//	| streamd_subscription_oldest_unsettled_age_seconds    | gauge     | subscription                 | age of the oldest of them, 0 when there is none                            |
//	| streamd_subscription_up                              | gauge     | subscription                 | 1 while the subscription is healthy, 0 while starting or stopped           |
//	| streamd_watch_overflows_total                        | counter   | stream                       | overflows of the file notification queue                                   |
//	| streamd_poll_reads_total                             | counter   | stream                       | changes of the file found by the poll rather than a notification           |
//	| streamd_offset_commits_total                         | counter   | result                       | commits of the positions to the sidecar; result is success or failure      |
//	| streamd_pipe_unsubscribed_lines_total                | counter   |                              | streamd pipe: stdin lines of a key no subscription reads, dropped          |
//	| streamd_offset_commit_duration_seconds               | histogram |                              | time a commit took, fsyncs included (etcd's fsync buckets, 1 ms to 8.2 s)  |
//	| streamd_config_last_reload_successful                | gauge     |                              | 1 if the last configuration load or reload succeeded, else 0               |
//	| streamd_config_last_reload_success_timestamp_seconds | gauge     |                              | timestamp of the last successful load or reload                            |
//	| streamd_build_info                                   | gauge     | version, revision, branch, goversion, goos, goarch, tags | always 1 |
//
// Enum label values: reason is checksum, format, lost (records lost to
// the reader: the file of its stored position gone, a file truncated
// before its records were read), removal (no stream file where a
// subscription starts), torn_tail, overflow (the per-subscription view of
// a watch overflow, also counted in streamd_watch_overflows_total of its
// stream), invalid_line (streamd pipe) or unreadable (an I/O error reading
// the file, once per spell); change is replaced, removed or truncated
// (routine with rotations: a rename, the gap before the next file, a
// copytruncate); outcome is ack, drop, retry, retry_after,
// failed, foreign_copy, decode_error or panic; operation is ack, drop,
// retry or reject. The reason of streamd_handler_failed_deliveries_total is
// the handler's failure (handler.Failure): unreachable, tls, timeout, http_status,
// exec_start, exec_signal, exec_status, tempfail or other; the
// daemon creates each at 0 ([SubscriptionMetrics.FailedDeliveries]).
//
// A subscription's lag, streamd_stream_lag_bytes, is set with the size
// of the stream, each commit interval: the size at the path minus the
// position while the subscription reads the file at the path. While it
// reads a file that a rotation renamed away from the path, or the copy of
// a file that copytruncate truncated, it is the rest of that file, plus
// the files rotated after it, plus the file at the path past its header,
// as streamd offsets show counts it: the size at the path minus the
// position, which is in another file then, would mean nothing.
//
// [NewRegistry] adds the go_* and process_* metrics of the Go runtime and
// process collectors.
package metrics
