// Package offsets keeps the resume positions of streamd's subscriptions in
// a sidecar file, because the SeaStreamer file transport stores none, and
// computes which position a subscription may store while its records
// settle out of order.
//
// # On-disk format
//
// A state directory holds:
//
//	offsets.json      the sidecar: every subscription's position as of the last commit
//	offsets.json.tmp  a commit under way, or one cut short by a crash; never read
//	lock              flock(2)ed by the one process using the directory; holds its PID
//	settled.json      from a graceful stop to the next start: the records each
//	                  subscription settled beyond its position ([Settled])
//	settled.json.tmp  the same, as offsets.json.tmp
//
// The sidecar is indented JSON, subscriptions sorted by name:
//
//	{
//	  "version": 2,
//	  "subscriptions": {
//	    "billing": {
//	      "stream": "/var/lib/seastreamer/orders.ss",
//	      "file": {
//	        "ino": 1311020,
//	        "file_name": "orders",
//	        "created_at_ms": 1694767177437
//	      },
//	      "offset": 4096,
//	      "last_seq": 17,
//	      "committed_at": "2025-03-01T12:00:00.5Z"
//	    }
//	  }
//	}
//
// For each subscription: stream is the stream file's path; file identifies
// the file the offset belongs to ([streamfile.Identity]: inode from
// stat(2), file name and creation time in milliseconds from the file's
// header), so that a replaced file is not read from its predecessor's
// offset; offset is the byte offset of the next frame to read; last_seq is
// the sequence number of the last settled record; committed_at is when the
// entry last changed on disk, in UTC.
//
// Version 1 also held the device number of the file ("dev", before
// "ino"). That number can change at a reboot, and a position that names it
// no longer applies to its file then. A sidecar of version 1 is read as
// well, its device numbers ignored; the next commit that stores a position
// writes version 2, which a streamd that reads version 1 only refuses as
// corrupt.
//
// Decoding is strict. The file must be one JSON object and nothing else,
// of version 2 or 1, with every field of its version present exactly once,
// no other field (keys match exactly, not case-insensitively), no null and
// no negative offset.
// An empty file, NUL bytes, a truncated or invalid JSON text, another
// version, an unknown or missing field: each is a [*CorruptError] that
// names the file, says what is wrong and how to recover. [Open] and [Load]
// never fall back to empty positions on a damaged file, and never change
// it. A missing sidecar is a fresh start, unless [Options.Marker] names a
// file that shows the directory was used (the daemon's retry spool, which
// it creates after Open): then the positions were lost, and Open fails with
// a [*MissingError] that says how to go on. With a marker, the first Open
// in a directory writes a sidecar with no positions at once, so that a
// used directory always has one, even if no position was ever stored.
//
// # Invariants
//
// A stored position never passes a record whose outcome is not final
// (DESIGN.md, Invariant 1). A [Tracker] per subscription gives the end of
// the longest prefix of settled records; only that goes to [Store.Set].
// Every commit calls [Options.Sync] after it has captured the positions and
// before it writes them, so the stream files holding the copies of the
// records those positions pass are fsynced first (Invariant 2), once per
// commit. Commits are atomic and durable, and one process at a time uses a
// state directory (Invariant 3): [Open] takes an exclusive, non-blocking
// flock on the lock file and fails at once with a [*LockedError] if another
// process, or another Store in this process, holds it. The kernel drops the
// lock when the process dies, so a crash leaves no stale lock behind. Each
// commit makes the lock file and the sidecar again if they were removed
// meanwhile; a lock file that another process made there instead fails
// every commit with an error that wraps a [*LockedError].
//
// # Crash semantics
//
// A commit writes offsets.json.tmp, fsyncs and closes it, renames it over
// offsets.json and fsyncs the directory; on error it removes the temporary
// file and the positions stay pending for the next commit. A crash at any
// instant, kill -9 or power loss, leaves the sidecar of the last commit that
// completed, or of the one in flight, never a mix of them. Delivery is
// therefore at least once: after a restart a subscription resumes at its
// last committed position, and the records settled since that commit (at
// most one commit interval's worth, plus those in flight) are delivered
// again. No record is skipped.
//
// The crash tests kill the process inside a commit at two failpoints (see
// internal/failpoint): offsets.write writes a prefix of offsets.json.tmp
// and dies, offsets.commit dies after it was written and fsynced, before
// the rename. Either leaves the sidecar of the previous commit and a
// temporary file that Load never reads and the next commit truncates.
//
// # Usage
//
// The daemon opens the store, resumes each subscription from its stored
// position, and commits on a ticker and at shutdown:
//
//	store, err := offsets.Open(stateDir, offsets.Options{Sync: writers.Sync, Observe: m.observeCommit, Marker: retrytimer.SpoolName})
//	if err != nil {
//		return err // *offsets.LockedError, *offsets.CorruptError, *offsets.MissingError, or I/O
//	}
//	defer store.Close()
//	pos, ok := store.Get("billing") // resume here if ok and pos.File matches the file
//	tracker := offsets.NewTracker(offsets.Mark{Offset: pos.Offset, Seq: pos.LastSeq}, 1024)
//	g.Go(func() error { return store.Run(ctx, time.Second) }) // every second, and once more at the end
//
//	// reader, in file order:
//	ticket, err := tracker.Begin(ctx, rec.Offset, rec.End, rec.Seq)
//	// handler, once the outcome is final:
//	err = tracker.Settle(ticket)
//	m := tracker.Committable()
//	err = store.Set("billing", offsets.Position{Stream: path, File: id, Offset: m.Offset, LastSeq: m.Seq})
//
// "streamd offsets show" reads positions with [Load], which takes no lock.
// "streamd offsets set" uses [Open], [Store.Set], [Store.Commit] and
// [Store.Close], so it fails with a [*LockedError] while a daemon runs
// rather than racing it.
//
// The package starts no goroutines: [Store.Run] runs in its caller's.
package offsets
