// Package tail follows one live SeaStreamer stream file (.ss) and hands out
// its records as the file grows, whatever happens to the file meanwhile.
// It is streamd's reader: it knows frames, offsets and files, not what the
// records mean (the daemon filters keys and settles records).
//
// # Usage
//
//	start, err := tail.ParseStart("seq:42")                 // from config: beginning, end, seq:N, time:RFC3339, offset:N
//	fl, err := tail.New(tail.Options{Path: path, Key: "orders", Start: start, Resume: stored, Logger: logger, Observer: obs})
//	defer fl.Close()
//	for {
//		rec, err := fl.Next(ctx) // blocks until a record is there
//		if err != nil {
//			break // io.EOF at the end of stream (or of a replay), ctx.Err(), or a fatal error
//		}
//		// rec.Frame, rec.Offset, rec.End, rec.File; rec and its payload are valid until the next Next
//	}
//
// [New] opens the file and finds the start position; it starts no
// goroutine. [Follower.Next] is pull-style: it decodes straight from the
// file through a [streamfile.Decoder] and allocates nothing per record, so
// a slow consumer is back-pressure and memory stays bounded (one read
// buffer of up to 256 KiB, or the size of the largest frame). One
// goroutine calls Next; [Follower.Close] comes after Next has returned
// (cancel its context to make it return).
//
// # Positions and identity
//
// A position is a file identity and an offset ([Position]). The identity
// ([streamfile.Identity]) is the inode number of the file and the file name
// and creation time in its header: a file renamed over the path, deleted
// and created again, or truncated and rewritten with a new header is
// another file. The device number is not part of it: it can change at a
// reboot, and a stored position must still apply then. While it runs, the
// follower tells that the path names another file by the device and inode
// numbers of both (see Following). Every [Record] carries the identity of
// its file and the offsets of its frame; Record.End is where the next frame
// starts, the position to store once the record is settled.
// [Follower.Position] is the position of the next record.
//
// A stored position passed as [Options.Resume] is used when the file at the
// path has its identity, and is checked to be a frame boundary of the file.
// If the identity differs, a live follower looks for the file that has it
// in the directory of the path, or of the file a symlink there names
// ([streamfile.Locate]: where a rotation renamed it while nothing followed
// the path), or else a copy of it there with more than the offset
// ([streamfile.LocateCopy]: where logrotate's copytruncate put its records
// before it truncated it), and reads that file first, then the files
// rotated after it and the one at the path, as after rotations while
// following. If there is none, the file at the path is read from its beginning, logged at
// ERROR; if the offset is past the end of its file or not a frame boundary
// (the file was truncated or rewritten), that file is, with a warning:
// each with an [Event]. Without a stored position, [Options.Start]
// applies:
//
//	beginning     the first frame
//	end           after the last complete frame when following starts (spec §11.3)
//	seq:N         the first frame of Options.Key with a sequence of N or more
//	time:T        the first frame of Options.Key with a timestamp strictly after T
//	offset:N      the frame at N, which must be a frame boundary; anything else is an error
//
// seq: and time: bisect over the beacons ([streamfile.Seek], O(log n) beacon
// reads), then read forward from the last beacon before the target. Frames
// of other keys between that point and the target are passed over, as the
// upstream seek does. When no frame reaches the target yet, a live follower
// starts at the end and passes over frames until one does; a replay
// finishes at once.
//
// # Following
//
// The follower waits for more data when the decoder reaches the end of the
// data, or a frame or beacon that is not complete yet (a torn tail): that
// is no error, and once the rest is written it continues exactly at the
// start of the incomplete frame, whatever sizes the writes come in. It
// wakes up on fsnotify notifications for the file's parent directory (a
// watch on the file itself would die with it), and those of the file a
// symlink at the path names, in its own directory, and polls every
// [Options.PollInterval] (1 s by default) when no notification comes:
// notifications are hints. A goroutine drains the notifications into one
// pending wake-up, so the kernel queue does not fill up behind a slow
// consumer. After each wake-up it looks at the file and the path, and:
//
//   - a file that shrank below the read position, or whose header changed,
//     was truncated or rewritten in place: it is read again from its
//     beginning ([EventTruncated]); unless a copy of it in the directory
//     holds more than was read (logrotate's copytruncate,
//     [streamfile.LocateCopy]): that copy is read on from the position to
//     its end first, then the file, as after a rotation;
//   - a path that names another file (renamed over, deleted and created
//     again, a symlink retargeted): the old file is read to its end first,
//     and followed until it has not grown for [Options.RotationGrace] (a
//     producer may still write to it), then the next one is read from its
//     beginning ([EventReplaced]; the log line counts the records read
//     from the old file after the switch was noticed): the file rotated
//     next within the directory when rotations closer together than the
//     follower's lag left several ([streamfile.NextRotated]), or else the
//     one at the path; an incomplete frame at the end of the old file is
//     lost ([EventTornTail]); a stream file the follower left lately (one
//     of the last four) that comes back to the path (a rename undone
//     after another file sat there) is read on from where it was left, not
//     read again, if the last record read of it still reads the same;
//   - a path that is gone: the follower reports it ([EventRemoved], and a
//     log line every 10 s: the first at INFO when the open file was
//     renamed, as by a rotation, at WARN when it was removed), keeps
//     reading the open file (a writer may still append to it), and takes
//     the new file when the path comes back (the files rotated in between
//     first);
//   - an overflow of the notification queue ([EventOverflow]) is followed
//     by the same look as a poll, so nothing is missed;
//   - a replacement that cannot be opened (no permission, not a regular
//     file) is counted once ([EventReplaced]) and tried again at each
//     wake-up while the position stays at the end of the old file;
//   - a read of the open file that fails (an I/O error) is counted once per
//     spell ([EventUnreadable]) and tried again at the same offset at each
//     wake-up; a replay fails instead.
//
// Those troubles are logged at once, then at most every 10 s, and once more
// when they pass.
//
// A poll that finds a change is counted as [EventPollRead]; with
// [Options.PollOnly] there are no notifications and every change is found
// so. The end-of-stream frame is returned like any record
// ([streamfile.Frame.IsEOS]); the follow ends there and Next returns
// io.EOF from then on. With [Options.Replay] the follower reads to the end
// of the data (or the end of stream) and returns io.EOF, or an error
// wrapping [streamfile.ErrTruncated] when the data ends inside a frame.
//
// A frame whose checksum does not match, or bytes that are not a frame, are
// counted ([EventChecksum], [EventFormat]), logged at most every 10 s, and
// skipped by default: a frame with a bad checksum has intact framing, so
// reading goes on after it; after unparsable bytes it goes on at the first
// whole frame before the next beacon ([streamfile.WholeFrameAfter]), else
// at the first frame after that beacon, and at the damaged bytes' offset
// once a frame can be read there (streamd repair cut them, a writer
// appended). A frame that runs past the end of the file with whole frames
// after it ([streamfile.DamagedSize]) is unparsable too, not a torn tail:
// a live follower checks once the file has not grown there for
// [Options.RotationGrace]. Corrupt frames the log limit left out are
// logged once it allows, with the last one's offset. With [StopOnCorrupt], Next returns the error. Before damage is
// reported, the follower checks that the file was not truncated or
// rewritten under it.
//
// # Observing
//
// An [Observer] gets the number of records and bytes read (in batches:
// before every wait, and every MiB while catching up), every [Event], and
// the troubles with the file at the path that keep a live follower from
// reading on (not a stream file, unreadable, a replacement it cannot
// open), then their end ([Observer.Trouble]), for a health check. It is
// called on the goroutine of Next, so it can feed Prometheus counters
// without locking of its own; metrics live elsewhere.
//
// # Limits
//
// A file truncated and rewritten in place with the very same header keeps
// its identity. The follower notices the truncation when it sees the file
// smaller than its read position, and reads the file from its beginning
// with the same identity, so offsets go back; if the new content has grown
// past the old position before the follower looks, nothing tells the files
// apart. Writers must put a new creation time in the header of a new file,
// as the upstream writer does.
//
// A live follower takes one inotify instance (Linux allows 128 per user by
// default) and two goroutines of its own, unless followers share a
// [Watcher], which holds one instance and two goroutines for them all. A
// symlink at the path is followed: the directory of the file it names is
// watched too (one watch more when it is another directory than the
// path's), and the watch moves with the symlink when it is retargeted;
// symlinks between the path and that file, in a chain, are not watched:
// their changes are found at the next notification or poll, and the grace
// of a file left so counts from its last write or the look before, not
// from the poll.
//
// Delivery is at least once for the daemon as a whole: after a restart, the
// follower resumes at the stored position, and records after it are
// delivered again.
package tail
