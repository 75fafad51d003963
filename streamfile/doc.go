// Package streamfile reads and writes SeaStreamer stream files (.ss, format
// version 1), byte for byte as the upstream sea-streamer-file crate does:
// files it writes are read by the upstream readers, and files they write
// are read here. It knows bytes, frames and offsets; following a file that
// grows or is replaced is package tail's business, what records mean the
// daemon's.
//
// # Format
//
// The format is specified in spec/stream-file-format.md; in brief, all
// integers are unsigned big-endian, and a file is:
//
//	header   128 bytes at offset 0: magic "Ss", version 1, the file name
//	         (at most 111 bytes), the creation time in ms, the beacon
//	         interval I, zero padding ending in 0x0D
//	frames   one after another from offset 128: stream key (1-byte length,
//	         at most 249 bytes of [A-Za-z0-9._-]), shard id u64, sequence
//	         u64, timestamp ms u64, payload size u32, payload, checksum u16,
//	         trailer 0x0D
//	beacons  at every multiple of I that the file reaches, and nowhere
//	         else: the number of bytes left of the frame the beacon cuts
//	         (a frame that reaches a boundary continues after the beacon),
//	         and up to 127 markers (stream key, shard, highest sequence and
//	         timestamp, running checksum) for the streams written so far,
//	         taken round-robin
//
// A frame's checksum is the CRC-16/CDMA2000 ([CRC16]) of its payload only.
// A marker's running checksum chains the checksums of its stream's frames
// within one writing run; readers do not check it. The end of a stream is
// a frame with key [EOSKey] and payload [EOSPayload]: a [Decoder] returns
// it like any frame ([Frame.IsEOS]) and [ErrEndOfStream] after it.
//
// Beacons let a reader start anywhere: from the beacon at a boundary it
// skips the rest of the frame the beacon cuts and finds the next frame
// boundary, so a [Decoder] starts at the header's end or at any frame
// boundary, [End] finds the end of the last complete frame from the last
// beacons, and [Seek] bisects over the beacons' markers for a stream's
// sequence number or timestamp.
//
// # Reading
//
//	h, err := streamfile.ReadHeader(f)
//	d := streamfile.NewDecoder(f, h, streamfile.HeaderSize) // f: any io.ReaderAt
//	for {
//		rec, err := d.Next() // rec.Frame, rec.Offset, rec.End; the payload is valid until the next call
//		if err != nil {
//			break // see below
//		}
//	}
//
// [Decoder.Next] returns io.EOF when no byte follows the last complete
// frame, [ErrTruncated] at a torn tail, [ErrEndOfStream] after the
// end-of-stream frame, a [*ChecksumError] for a frame whose payload does
// not match its checksum (its framing is intact: Next goes on after it),
// and a [*FormatError] for bytes that are not a frame
// ([Decoder.SkipDamage] goes on where a reader that skips damage does). A decoder reads through one buffer of up to 256 KiB, or the
// size of the largest frame, and allocates nothing per frame.
//
// # Torn tails
//
// Writers buffer and may die in the middle of a write, so a file can end
// inside a frame or a beacon: a torn tail. It is no damage. Next returns
// [ErrTruncated], returns nothing of the incomplete frame, and stays at the
// frame's first byte, which is the offset to store as a position. It also
// forgets the bytes it read of the frame, so that the next call reads the
// file again from there: once a writer completes the frame it comes out
// whole, and if a writer repaired the tail instead (truncated it and wrote
// other frames, as a [Writer] does), the new bytes come out, never a mix of
// old and new. What to do at a torn tail is the reader's call: a follower
// waits for the rest, streamd decode prints a "truncated" line and exits
// 0, a writer that continues the file truncates it. A frame torn at the end
// of a file that nobody will write again is lost.
//
// # Writing
//
// A [Writer] appends batches of frames. Each batch ([Writer.Publish],
// which gives each frame the next sequence number of its stream and shard,
// or [Writer.Append]) is one write under an exclusive flock on the file.
// Under the lock the writer first catches up with what other cooperating
// writers appended since its last batch, so that beacons and markers stay
// where readers expect them; a torn tail is truncated and a trailing
// end-of-stream frame overwritten before writing. A crash in the middle of
// a batch leaves a torn tail that the next writer repairs, and zeros to
// the end (what a crash can leave) are removed too. A file whose readable
// records stop before its end (an end-of-stream frame followed by frames,
// other bytes after the last good frame) is refused with a [*DamageError]
// and left as it is; [Repair] truncates it to its last frame readers
// reach. A file truncated under its writer is continued as it is then,
// with a new header first when it is shorter than one; a batch whose write
// raced such a truncation (and so followed a hole where the header was) is
// written again after a new header. A file that begins with a hole where
// its header was (such a race in a writer that did not catch it) is
// started over too, logged as an error: the frames after the hole are lost. [Writer.Sync]
// makes the batches durable. Writers that do not take the lock (the
// upstream producer keeps its state in memory) must not share a file with
// one that does.
//
// # Replacement
//
// Another file may take the path of the one being written: one renamed
// over it (a rotation), or the file deleted and created again. Writers and
// readers move to the new file together, and no record is lost between
// them:
//
//   - a Writer opened with [CreateOptions.RefuseReplaced] checks, under
//     its exclusive lock and before writing a batch, that the path still
//     names its open file; when it does not, the batch writes nothing and
//     returns [ErrReplaced] (a path that is gone is no replacement: the
//     writer goes on with the open file, which its readers still hold,
//     unless the file was deleted, which is [ErrRemoved]);
//   - an [Appender] then opens the file now at the path, syncs and closes
//     the old one, and writes the batch to the new file, continuing its
//     sequence numbers. streamd publish and the daemon's retry copies
//     write so;
//   - a reader that finds the path naming another file reads the old one
//     to its end, then takes a shared flock on it and looks at its size.
//     A writer that found the path unchanged under its exclusive lock has
//     finished its batch once the shared lock is granted, and every later
//     batch finds the replacement: when the old file did not grow, the
//     reader has read all of it and leaves it for the new file, which it
//     reads from the beginning (tail.Follower does this, after the old
//     file stayed quiet for its rotation grace period, for a producer that
//     kept the old file open). A frame torn at the end of the old file is
//     lost.
//
// A position stored for later names its file by [Identity]: the inode
// number and the header's file name and creation time, not the device
// number, which can change at a reboot.
//
// # Printing
//
// A [Format] prints what a file holds as text lines, in the SeaStreamer
// stdio form ([FormatLog]) or as ndjson ([FormatNDJSON]): [Format.Print]
// prints a whole file as streamd decode does, and [Format.AppendFrame] one
// message, as the stdout handler does with what it knows of the delivery.
// [PublishLines] goes the other way, from stdio lines to batches of frames.
package streamfile
