// Package retrytimer holds delayed copies of records (the copies a handler
// asks for with retry_after) until they are due, and then hands each to a
// [FireFunc], which writes it to its stream. What a copy is for, where it
// goes and what its bytes mean is the caller's business: [Copy.Stream] is
// opaque here, and [Copy.Record] carries the bytes to write in their final
// form (the daemon envelopes a copy before it schedules it).
//
// The reference runtime keeps such copies in memory, so a crash loses them.
// A [Queue] opened with a spool directory keeps them in a durable spool
// instead: once [Queue.Schedule] has returned, the copy survives kill -9 and
// power loss, and is fired after a restart once it is due. A queue without a
// directory is memory-only, for streamd pipe, which keeps no state.
//
// # Usage
//
//	q, err := retrytimer.Open(retrytimer.Options{Dir: stateDir, Fire: appendCopy, Logger: logger})
//	// handle err
//	go func() { errc <- q.Run(ctx) }()       // fires copies as they come due
//	err = q.Schedule(c, time.Now().Add(d))   // durable when it returns
//	// stop, file mode: cancel ctx and wait for Run, then
//	err = q.Close()                          // pending copies stay in the spool
//	// stop, pipe mode: cancel ctx and wait for Run, then
//	abandoned, err := q.Drain(shutdownCtx)   // fire the rest, up to a deadline
//	err = q.Close()
//
// # Timing and order
//
// Copies fire in order of due time, and copies due at the same time in the
// order they were scheduled. A copy fires at its due time, read
// from the wall clock ([Options.Now], by default [time.Now]): the due time
// is stored as Unix nanoseconds so that it means the same after a restart.
// A copy that is already due (after a restart, say) fires at once. The
// queue waits on one [time.Timer], reset to the earliest due time; there is
// no polling.
//
// The wall clock can be stepped, by an administrator, by NTP at boot, or
// between a crash and the restart. Each copy therefore keeps its delay, the
// time from its Schedule to its due time, besides the due time itself, and
// the queue holds no copy much longer than its delay:
//
//   - Stepped back, the clock makes due - delay, the time the copy was
//     scheduled, lie in the future. The queue looks for such copies at
//     Open, and while it runs whenever a reading of the clock (at Schedule,
//     and each time its timer fires) is earlier than the one before; it
//     makes each of them due its delay after the new reading. So a copy
//     waits at most its delay after Open, and in a running queue at most its
//     delay after the step is noticed, which is by its own original due
//     time: under twice its delay in all, however far back the clock went
//     (a day, a year). Only the entry in memory changes; the record in the
//     spool keeps the original due time, and a restart clamps again.
//   - Stepped forward, the clock makes copies due early: they fire the next
//     time the queue reads the clock (when its timer for the earliest copy
//     fires, or at once after a restart). Nothing is lost, and nothing fires
//     twice.
//
// Copies of type 1 spool records (written before the delay was kept) have
// no delay to clamp to, and keep the wall-clock behaviour: a clock stepped
// back holds them back by the step.
//
// [Queue.Run] and [Queue.Drain] call the FireFunc on their own goroutine,
// one copy at a time. If it returns an error, the copy stays pending and is
// tried again after [Options.RetryBackoff], doubling on each failure up to
// [Options.MaxRetryBackoff]; copies behind it are not held up. Failures are
// logged as warnings through [Options.Logger], at most one line per 10 s
// with the number of failures left out. Since the caller supplies the
// FireFunc, the caller counts failures (in a metric) there.
//
// # Spool format
//
// The spool is one file, retry.spool, in the spool directory: the 8 bytes
// "SDRETRY1" (the last byte is the format version), then records, appended
// and never rewritten in place:
//
//	record    = length u32 | length-crc u32 | body-crc u32 | body    (little-endian)
//	length    = len(body); length-crc = CRC-32C of the 4 length bytes; body-crc = CRC-32C of body
//	body      = schedule | done | schedule3 | schedule1
//	schedule  = 0x04 | id u64 | due i64 (Unix ns) | delay i64 (ns, ≥ 0) |
//	            stream bytes | key bytes | record bytes | subscription bytes
//	done      = 0x02 | id u64
//	schedule3 = 0x03 | id u64 | due i64 (Unix ns) | delay i64 (ns, ≥ 0) | copy1   (read, never written)
//	schedule1 = 0x01 | id u64 | due i64 (Unix ns) | copy1                        (read, never written)
//	copy1     = stream bytes | key bytes | nheaders u32 |
//	            nheaders × (name bytes | value bytes) | payload bytes
//	bytes     = len u32 | len bytes
//
// CRC-32C is [hash/crc32] with the Castagnoli table. Ids are unique within
// a file and increase with scheduling, so they also break ties between equal
// due times. A copy is pending when the file holds its schedule record and
// no done record for it. delay is the copy's delay when it was scheduled
// (see Timing and order). record is [Copy.Record], byte for byte, and
// subscription [Copy.Subscription].
//
// Type 1 and type 3 schedule records are what earlier versions wrote: type 1
// before the delay was kept, both before copies reached the queue in their
// final form, so they hold the copy's headers and payload apart. They are
// still read, in a file with records of the other types or alone, and
// compaction keeps them as they are. Their copies fire with the record an
// earlier version wrote for them: the envelope of the headers and payload
// for the stream-file transport
// ([github.com/streamd/streamd/envelope.Encode] with line false), the one
// use the package makes of envelopes. The file header stays "SDRETRY1": an
// earlier version that opens a spool holding a record of a type it does not
// know (3 or 4) fails with "unknown record type" and the type at its offset,
// naming the file, rather than misreading it.
//
// # Crash semantics
//
// Schedule appends the schedule record and fsyncs the file before it
// returns; concurrent calls share one fsync (group commit). After copies
// are fired, [Options.Durable] makes them durable where the FireFunc wrote
// them (the daemon fsyncs its stream files), once for the copies that
// fired together (up to 256); only then are their done records appended,
// without fsync. While Durable fails, or the done records cannot be written
// for a full disk ([Options.Stuck]), no more copies fire, the fired ones
// stay pending in the spool (and count in [Queue.Pending]), and both are
// tried again after [Options.RetryBackoff]. Therefore:
//
//   - A copy whose Schedule returned is never lost. A copy whose Schedule
//     did not return may be lost, or may fire.
//   - Delivery is at least once: a crash between a successful fire and its
//     done record reaching the file (kill -9 before the write, or power loss
//     before the kernel writes the page) fires the copy again after restart,
//     so the stream gets it twice. A power loss cannot keep a done record
//     and lose its copy: the copy was durable before the record was written. [Queue.Close] syncs done records, so a
//     clean stop does not repeat copies.
//   - A copy never fires before its delay has passed, before or after a
//     restart, unless the wall clock is stepped forward (see Timing and
//     order); a clock stepped back moves its due time earlier, to its
//     delay from the step.
//
// The crash tests kill the process in the middle of a spool append at the
// failpoint retrytimer.spool (see internal/failpoint), which leaves a torn
// tail: a prefix of a schedule or done record.
//
// On load, damage that a crash during the last append can leave is a torn
// tail, which was never acknowledged: it is truncated away (and logged). A
// tail is torn when it is shorter than a record header, when its header is
// intact but its body runs past the end of the file, when everything from a
// damaged header to the end is zero bytes, or when the last record's body
// fails its checksum. The length has its own checksum so that a damaged
// length in the middle of the file is not mistaken for a torn tail. Any
// other damage (a bad checksum before the last record, a bad header, an
// unknown record type, a done record for a copy that is not pending) makes
// [Open] fail with an error that names the file and the offset. Nothing is
// skipped silently: moving the file aside starts an empty spool, and loses
// the copies pending in it.
//
// # Compaction
//
// Once fired copies (and done records) take more bytes than pending ones,
// and at least [Options.CompactMinBytes], the queue writes the pending
// schedule records to retry.spool.tmp in the same directory, fsyncs it,
// renames it over retry.spool and fsyncs the directory. A crash at any point
// leaves either the old or the new file, each holding every pending copy; a
// leftover temporary file is removed on load. The spool thus returns to its
// 8-byte header once every copy has fired, and its size stays below about
// twice the pending bytes plus CompactMinBytes. Compaction runs on the
// firing goroutine and holds the queue while it copies the pending records,
// so Schedule waits for it. Each compaction copies fewer bytes than it
// drops, so over time it copies no more than was appended. A compaction that
// fails before the rename leaves the spool as it was, is logged, and is
// tried again once another CompactMinBytes of fired copies have built up.
//
// # Failures
//
// A Schedule whose write fails (a full disk) truncates the part of its
// record that the write left, so the spool is as it was: Schedule returns
// the error, the copy is not scheduled, and a later Schedule may succeed
// once there is space; a done record that does not fit holds the queue
// (see above). Any other failure (an fsync, a write whose partial record
// cannot be removed, another write error) fails the queue for good:
// Schedule returns the error, Run and Drain return it, and nothing more is
// written, so that a partial write can only be a torn tail. The process
// should exit and restart from the spool.
//
// # Concurrency
//
// Schedule and Pending may be called from any goroutine, at any time before
// Close, including while Run or Drain runs. At most one of Run and Drain
// runs at a time. Close is called after they have returned. One Queue at a
// time may use a spool directory: streamd holds the state directory's lock.
//
// # Memory
//
// With a spool, a pending copy costs one heap entry of 64 bytes; its record
// stays on disk and is read back when it fires. 100 000 pending copies of
// 1 KiB measured 6.8 MiB of heap (TestMemory100kPending,
// BenchmarkPending100k). A memory-only queue keeps each copy's spool
// record in memory as well: the same 100 000 copies measured 116 MiB of live
// heap, about 1.2 KiB each, so a caller that must bound memory in that mode
// bounds how many copies it leaves pending. Scheduling and firing cost
// O(log n) in the number pending.
package retrytimer
