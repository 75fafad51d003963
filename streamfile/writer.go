package streamfile

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/internal/failpoint"
)

// Writer appends frames to a stream file, placing beacons, markers and
// running checksums exactly as a single upstream writer does (spec §6).
//
// Every batch ([Writer.Append], [Writer.Publish]) runs under an exclusive
// flock on the file. When the file grew since this writer's last batch,
// because another cooperating writer appended to it, the writer reads the new
// frames first and continues after them, so beacons stay where readers expect
// them. Writers that do not take the lock must not share the file.
//
// Continuing a file (spec §10), [Writer.Publish] starts the marker entry of
// the first stream it writes as the upstream writer does: with that
// stream's highest sequence in the file and the payload checksum of that
// frame as the running checksum (other streams start at 0xFFFF). It
// differs from the upstream writer where the upstream behaviour is unsafe:
//   - a trailing end-of-stream frame is always overwritten, also in a file
//     shorter than one beacon interval (upstream leaves it in place there,
//     which ends every reader before the new frames);
//   - bytes after the last complete frame that are a torn frame, or zeros
//     to the end (a crash can leave them in place of the pages of an
//     append that did not reach the disk, after the first bytes of a torn
//     frame too; logged), are truncated before writing, so the file is
//     never momentarily inconsistent;
//   - a file whose readable records stop before its end, at an
//     end-of-stream frame followed by frames or at other bytes after the
//     last good frame, is refused ([*DamageError]), since no reader would
//     reach the new frames; [Repair] truncates it;
//   - a file that ends on a boundary without its beacon gets the beacon
//     written, instead of being overwritten from offset 0;
//   - a complete beacon that follows the last frame is kept, not replaced by
//     an empty one.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	f              *os.File
	syncFailed     atomic.Pointer[error] // the first failed fsync (Sync)
	path           string                // checked before each batch when refuseReplaced is set
	refuseReplaced bool
	hdr            Header
	interval       int64
	perBeacon      int

	end    int64 // where the next byte goes; -1 until read from the file
	order  []*markerEntry
	index  map[streamShard]*markerEntry
	last   *markerEntry // the entry of the previous frame, to skip the map lookup
	count  uint64       // C of spec §6.3: markers written in this run
	seeded bool         // the first stream published in this run got its marker entry (seed)

	seqs map[streamShard]seqInfo // highest sequence per stream; nil until scanned

	buf    []byte
	ends   []int // where each frame of the batch ends in buf: how many a failed write left whole
	beacon Beacon
	log    *slog.Logger
}

type streamShard struct {
	key   string
	shard uint64
}

type markerEntry struct {
	streamShard
	seq, ts uint64
	running uint16
}

type seqInfo struct {
	seq, ts  uint64
	checksum uint16
}

// CreateOptions says how [OpenWriter] creates a missing file.
type CreateOptions struct {
	// Header is written when the file is missing or empty. For an existing
	// file, the file's own header wins.
	Header Header
	// Create allows creating the file. Without it a missing file is an error.
	Create bool
	// Mode is the permission bits of a file OpenWriter creates, set
	// whatever the umask; 0 is 0644 less the umask.
	Mode fs.FileMode
	// RefuseReplaced makes every batch check, under the file's lock and
	// before writing, that the path still names the open file. When another
	// file was renamed over it, or it was deleted and created again, the
	// batch writes nothing and returns [ErrReplaced]: a reader that moved
	// on to the new file, after a last read of the old one under a shared
	// lock, would never see it. When the open file was deleted and no file
	// is at the path, it writes nothing and returns [ErrRemoved]: no reader
	// that opens the path, or starts again, would see it. A file renamed
	// away, before another takes the path, is written on: its readers read
	// it to its end as a rotated file.
	RefuseReplaced bool
	// Log receives, as warnings, what the writer repairs or works around on
	// its own: an incomplete header written anew (with Create), zeros after
	// the last frame removed (and a torn frame before them, if any), a file
	// shorter than a header given a new one, a file that shrank or got
	// another header under the writer continued as it is now, a batch
	// written again after a truncation under it; and as an error a file
	// that begins with a hole where its header was, started over. nil
	// discards it.
	Log *slog.Logger
}

// ErrReplaced is returned by a batch of a Writer opened with
// [CreateOptions.RefuseReplaced] when the path names another file now.
var ErrReplaced = errors.New("streamfile: the path names another file than the one open for writing")

// ErrRemoved is returned by a batch of a Writer opened with
// [CreateOptions.RefuseReplaced] when the file open for writing was
// deleted and no file is at its path.
var ErrRemoved = errors.New("streamfile: the file open for writing was deleted, and no file is at its path")

// OpenWriter opens the stream file at path for appending, creating it with
// opts.Header when it is missing and opts.Create is set.
func OpenWriter(path string, opts CreateOptions) (*Writer, error) {
	flags := os.O_RDWR
	if opts.Create {
		if err := opts.Header.Validate(); err != nil {
			return nil, err
		}
		flags |= os.O_CREATE
	}
	f, err := openFile(path, flags, opts.Mode)
	if opts.Create && errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("streamfile: directory %s does not exist: a writer creates the file, not its directory; create it (%w)", filepath.Dir(path), err)
	}
	if _, ok := errors.AsType[*NotRegularError](err); ok {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("streamfile: open for writing: %w", err)
	}
	w := &Writer{f: f, path: path, refuseReplaced: opts.RefuseReplaced, end: -1, log: opts.Log}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	err = w.locked(func() error { return w.init(opts) })
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return w, nil
}

// openFile opens path with flags if it is a regular file (openRegular). A
// file it creates gets mode, when set, whatever the umask: it is created
// exclusively, so that the mode of a file another writer made is left
// alone.
func openFile(path string, flags int, mode fs.FileMode) (*os.File, error) {
	if flags&os.O_CREATE == 0 || mode == 0 {
		return openRegular(path, flags, 0o644)
	}
	f, err := openRegular(path, flags|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return openRegular(path, flags&^os.O_CREATE, 0)
	}
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(mode); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// init reads the header of the file, or writes it into an empty file or,
// when opts.Create is set, into one whose header is incomplete (a writer
// died while creating it, logged) or a hole (msgHeaderHole: the file is
// started over).
func (w *Writer) init(opts CreateOptions) error {
	size, err := w.size()
	if err != nil {
		return err
	}
	if size == 0 {
		if !opts.Create {
			return fmt.Errorf("streamfile: %s is empty and creating it was not allowed", w.f.Name())
		}
		return w.writeHeader(opts.Header)
	}
	h, err := ReadHeader(w.f)
	if errors.Is(err, ErrTruncated) && opts.Create {
		w.log.Warn("stream file has an incomplete header (a writer died while creating it, or it was truncated): writing the header anew", "file", w.f.Name(), "size", size)
		return w.writeHeader(opts.Header)
	}
	if err != nil && opts.Create {
		if w.headerHole() {
			w.log.Error(msgHeaderHole, "file", w.f.Name(), "size", size)
			return w.writeHeader(opts.Header)
		}
	}
	if errors.Is(err, ErrTruncated) {
		return fmt.Errorf("streamfile: %s has an incomplete %d-byte header: a writer died while creating it; remove the file", w.f.Name(), size)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", w.f.Name(), err)
	}
	w.setHeader(h)
	return nil
}

// writeHeader starts the file anew with header h: it truncates the file to
// 0 bytes and writes h (and, for a 128-byte interval, the empty beacon that
// follows it).
func (w *Writer) writeHeader(h Header) error {
	w.setHeader(h)
	b, _ := AppendHeader(nil, &h)
	if w.interval == HeaderSize {
		b = appendBeacon(b, &Beacon{}) // spec §3: the header ends on the first boundary
	}
	if err := w.f.Truncate(0); err != nil {
		return fmt.Errorf("streamfile: truncate %s to write its header: %w", w.f.Name(), err)
	}
	if _, err := w.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("streamfile: write header of %s: %w", w.f.Name(), err)
	}
	w.end = int64(len(b))
	return nil
}

// startOver makes the writer continue the file as it is now when it was
// truncated under it (logrotate's copytruncate, or another rewrite): when
// the file is shorter than a header, or shorter than what this writer
// wrote, or has another header. size is the file's size as the batch found
// it. A file shorter than a header, or that begins with a hole where its
// header was (msgHeaderHole), is started over with a new header (the old
// one's name and interval, the time now). It returns the file's size after
// that.
func (w *Writer) startOver(size int64) (int64, error) {
	// newHeader starts the file over with the old header's name and
	// interval, and the time now.
	newHeader := func() (int64, error) {
		w.forget()
		h := w.hdr
		h.CreatedAtMs = uint64(time.Now().UnixMilli())
		err := w.writeHeader(h)
		return w.end, err
	}
	if size < HeaderSize {
		w.log.Warn("stream file is shorter than a header (truncated, as by copytruncate): writing a new header first; "+msgShrank, "file", w.f.Name(), "size", size, "written_up_to", w.end)
		return newHeader()
	}
	h, err := ReadHeader(w.f)
	if err != nil {
		if w.headerHole() {
			w.log.Error(msgHeaderHole, "file", w.f.Name(), "size", size)
			return newHeader()
		}
		return 0, fmt.Errorf("%s: %w", w.f.Name(), err)
	}
	switch {
	case size < w.end:
		w.log.Warn("stream file shrank under its writer (truncated, as by copytruncate): continuing it as it is now; "+msgShrank, "file", w.f.Name(), "size", size, "written_up_to", w.end)
	case h != w.hdr:
		w.log.Warn("stream file has another header than when it was opened (rewritten in place): continuing it as it is now", "file", w.f.Name(), "size", size)
	default:
		return size, nil
	}
	w.forget()
	w.setHeader(h)
	return size, nil
}

// msgShrank ends the warnings of a file that shrank under its writer: what
// it wrote between a copy and the truncation is lost (copytruncate's
// window), and the writer cannot tell whether it wrote anything there.
const msgShrank = "what this writer appended after a copy of the file was made, if anything, is in neither file (rotate by renaming the file instead)"

func (w *Writer) setHeader(h Header) {
	w.hdr = h
	w.interval = int64(h.BeaconInterval)
	w.perBeacon = markersPerBeacon(h.BeaconInterval)
	w.index = make(map[streamShard]*markerEntry)
}

// Header returns the file's header.
func (w *Writer) Header() Header { return w.hdr }

// Name returns the path the file was opened with.
func (w *Writer) Name() string { return w.f.Name() }

// Size returns the offset after the last byte this writer knows to be valid.
func (w *Writer) Size() int64 { return w.end }

// Sync flushes the file to stable storage. Once an fsync failed, Sync
// fails for good with that error: the kernel may have dropped the pages
// the failure was about, and a later fsync would report success without
// them.
func (w *Writer) Sync() error {
	if err := w.syncFailed.Load(); err != nil {
		return *err
	}
	if err := w.f.Sync(); err != nil {
		err = fmt.Errorf("streamfile: fsync %s: %w", w.f.Name(), err)
		w.syncFailed.CompareAndSwap(nil, &err)
		return *w.syncFailed.Load()
	}
	return nil
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Append writes frames as given, in one batch, an end-of-stream frame too.
func (w *Writer) Append(frames ...Frame) error {
	return w.batch(frames, false)
}

// Publish writes frames in one batch, giving each the next sequence number of
// its stream key and shard in the file (the first is 1). The assigned numbers
// are stored into frames[i].Seq. A batch with a key the format reserves
// ([ReservedKey]) writes nothing. A write that fails part way returns an
// [*AppendError] saying how many of the frames it left whole in the file;
// one that fails only at the beacon after the last frame leaves them all
// whole, and succeeds (the next batch writes the beacon).
func (w *Writer) Publish(frames []Frame) error {
	return w.batch(frames, true)
}

func (w *Writer) batch(frames []Frame, assignSeq bool) error {
	for i := range frames {
		if i == 0 || frames[i].Key != frames[i-1].Key {
			err := ValidKey(frames[i].Key)
			if err == nil && assignSeq {
				err = ReservedKey(frames[i].Key)
			}
			if err != nil {
				return fmt.Errorf("streamfile: frame %d: %w", i, err)
			}
		}
		if int64(len(frames[i].Payload)) > 1<<32-1 {
			return fmt.Errorf("streamfile: frame %d: payload of %d bytes exceeds the 4 GiB limit", i, len(frames[i].Payload))
		}
		if frames[i].TimestampMs > maxTimestampMs {
			// Readers, this writer's own scan among them, refuse such a
			// frame: the file would be damaged from it on.
			return fmt.Errorf("streamfile: frame %d: timestamp %d ms is after year 9999", i, frames[i].TimestampMs)
		}
	}
	return w.locked(func() error {
		defer w.letGo()
		for range maxTruncatedBatches {
			err := w.writeBatch(frames, assignSeq)
			if !errors.Is(err, errTruncatedUnder) {
				return err
			}
			// The file was truncated (copytruncate takes no lock)
			// between the batch's look at it and its write, which left
			// the batch after a hole where the header was: start the
			// file over, and write the batch again.
			w.log.Warn("stream file was truncated while a batch was written (as by copytruncate): writing the batch again after a new header", "file", w.f.Name())
			if err := w.f.Truncate(0); err != nil {
				return fmt.Errorf("streamfile: truncate %s, truncated while a batch was written: %w", w.f.Name(), err)
			}
		}
		return fmt.Errorf("streamfile: %s was truncated while each of %d tries to write a batch was under way; nothing written", w.f.Name(), maxTruncatedBatches)
	})
}

// msgHeaderHole is logged when a writer finds the file begins with a hole
// where its header was: a batch of a writer that did not look for one
// (headerHole) was written past the end of the file truncated under it.
const msgHeaderHole = "stream file begins with a hole where its header was (a write raced a truncation, as by copytruncate, in a writer that did not catch it): starting it over; what follows the hole is lost"

// maxTruncatedBatches bounds the tries of a batch that keeps meeting
// truncations.
const maxTruncatedBatches = 5

// errTruncatedUnder is writeBatch's error when the file was truncated
// under the batch: its bytes follow a hole where the header was.
var errTruncatedUnder = errors.New("streamfile: truncated under the batch")

// testBeforeWrite, set by tests, runs under the lock just before a batch's
// bytes are written.
var testBeforeWrite func(f *os.File)

// writeBatch is one try of batch under the lock.
func (w *Writer) writeBatch(frames []Frame, assignSeq bool) error {
	open, err := w.f.Stat()
	if err != nil {
		return fmt.Errorf("streamfile: stat: %w", err)
	}
	if w.refuseReplaced {
		if err := w.checkPath(open); err != nil {
			return err
		}
	}
	size, err := w.startOver(open.Size())
	if err != nil {
		return err
	}
	var whole *scanEnd
	if assignSeq {
		// Before catching up, which may truncate a torn tail: the whole
		// file is read, and damage anywhere leaves it as it is.
		if whole, err = w.loadSeqs(size); err != nil {
			return err
		}
	}
	if err := w.catchUp(size, whole); err != nil {
		return err
	}
	if assignSeq && !w.seeded && len(frames) > 0 {
		w.seed(&frames[0])
	}
	w.buf, w.ends = w.buf[:0], w.ends[:0]
	if n := w.batchSize(frames); n > writerKeep && n > cap(w.buf) {
		// At once: grown a part at a time, a large batch would be
		// copied again at each doubling.
		w.buf = make([]byte, 0, n)
	}
	for i := range frames {
		f := &frames[i]
		if assignSeq {
			f.Seq = w.seqs[streamShard{f.Key, f.Shard}].seq + 1
		}
		w.ends = append(w.ends, w.encode(f))
	}
	failpoint.TornWrite(failpoint.StreamfileAppend, w.f, w.buf, w.end) // crash tests: a torn batch, under the flock, before any fsync
	if testBeforeWrite != nil {
		testBeforeWrite(w.f)
	}
	if n, err := writeAt(w.f, w.buf, w.end); err != nil {
		at := w.end
		w.forget()
		whole, _ := slices.BinarySearch(w.ends, n+1) // the frames that end within the n bytes written
		if whole == len(frames) && whole > 0 {
			// Only the beacon after the last frame, which ends on a
			// boundary, failed: the batch is whole as readers see it
			// (an error would have its caller write it again), and
			// the next batch writes the beacon.
			w.log.Warn("the beacon after a batch could not be written; the next batch writes it", "file", w.f.Name(), "offset", at+int64(w.ends[whole-1]), "err", err)
			return nil
		}
		return &AppendError{File: w.f.Name(), Offset: at, Frames: whole, Err: err}
	}
	w.end += int64(len(w.buf))
	// The batch is written; a header that cannot be read back now is the
	// next batch's to find (startOver).
	if w.headerHole() {
		w.forget()
		return errTruncatedUnder
	}
	return nil
}

// writerKeep is the most memory a Writer keeps, from one batch to the
// next, of what it encoded a batch into: a batch of lines of streamd
// publish (1 MiB of payload at most, but for one larger line) fits.
const writerKeep = 2 << 20

// batchSize bounds the bytes of frames as encoded, the beacons spliced in
// included: a beacon takes at most half an interval (markersPerBeacon).
func (w *Writer) batchSize(frames []Frame) int {
	var n int64
	for i := range frames {
		n += frames[i].Size()
	}
	beacon := int64(beaconOverhead + w.perBeacon*maxMarkerSize)
	return int(n + (n/(w.interval-beacon)+2)*beacon)
}

// letGo lets go of the memory a batch larger than writerKeep was encoded
// into, once the batch is done: a Writer kept open, as the daemon keeps
// the one that appends retry copies, would hold the largest batch it ever
// wrote for as long as it lives.
func (w *Writer) letGo() {
	if cap(w.buf) > writerKeep {
		w.buf = nil
	}
}

// headerHole reports whether the file's first HeaderSize bytes are all
// zero: a hole where its header was, which a write past the end of a file
// truncated under it leaves.
func (w *Writer) headerHole() bool {
	var b [HeaderSize]byte
	n, _ := w.f.ReadAt(b[:], 0) // shorter (truncated after the write): the next batch starts over
	return n == HeaderSize && b == [HeaderSize]byte{}
}

// AppendError is a batch whose write failed part way (a full disk, an I/O
// error). The first Frames frames of the batch are whole in the file from
// Offset on, as readers and writers see them (a frame that ends on a
// boundary is whole without the beacon after it, which the next batch
// writes). The bytes written after them, if any, are a torn frame (or
// beacon): readers wait at it as at a frame being written, and the next
// batch of any writer removes it before writing.
type AppendError struct {
	File   string
	Offset int64 // where the batch was written
	Frames int   // the frames of the batch left whole in the file
	Err    error
}

func (e *AppendError) Error() string {
	return fmt.Sprintf("streamfile: append to %s at offset %d: %v; an incomplete record it may have left at the end of the file is a torn tail, which readers wait at and the next append removes", e.File, e.Offset, e.Err)
}

func (e *AppendError) Unwrap() error { return e.Err }

// writeAt writes b at offset off of f, as f.WriteAt does, but returns the
// number of bytes written before a failure too: os.File.WriteAt returns 0
// when the pwrite after a short one fails (a disk that fills up part way).
func writeAt(f *os.File, b []byte, off int64) (n int, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	cerr := rc.Write(func(fd uintptr) bool {
		for n < len(b) && err == nil {
			var m int
			switch m, err = syscall.Pwrite(int(fd), b[n:], off+int64(n)); {
			case err == syscall.EINTR:
				err = nil
			case err == nil && m == 0:
				err = io.ErrUnexpectedEOF
			case err != nil:
				err = &fs.PathError{Op: "write", Path: f.Name(), Err: err}
			default:
				n += m
			}
		}
		return true // a regular file never waits for the poller
	})
	return n, cmp.Or(cerr, err)
}

// checkPath returns ErrReplaced when the path names another file than the
// open one, whose FileInfo is open, and ErrRemoved when it names none and
// the open file was deleted. A file renamed away, before another takes
// the path, is still written: its readers read it to its end as a rotated
// file.
func (w *Writer) checkPath(open os.FileInfo) error {
	at, err := os.Stat(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		if st, ok := open.Sys().(*syscall.Stat_t); ok && st.Nlink == 0 {
			return fmt.Errorf("%w (%s)", ErrRemoved, w.path)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("streamfile: %w", err)
	}
	if !os.SameFile(at, open) {
		return fmt.Errorf("%w (%s)", ErrReplaced, w.path)
	}
	return nil
}

// Stat returns the FileInfo of the open file.
func (w *Writer) Stat() (os.FileInfo, error) { return w.f.Stat() }

// locked runs fn while holding the exclusive flock on the file.
func (w *Writer) locked(fn func() error) (err error) {
	fd := w.f.Fd()
	if err := durable.Lock(fd, durable.Exclusive); err != nil {
		return fmt.Errorf("streamfile: lock %s: %w", w.f.Name(), err)
	}
	defer func() {
		// Deferred, so that the lock is released even if fn panics.
		if uerr := durable.Unlock(fd); uerr != nil && err == nil {
			err = fmt.Errorf("streamfile: unlock %s: %w", w.f.Name(), uerr)
		}
	}()
	return fn()
}

func (w *Writer) size() (int64, error) {
	fi, err := w.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("streamfile: stat: %w", err)
	}
	return fi.Size(), nil
}

// forget makes the next batch rebuild its state from the file, as a new
// writing run, after a failed write left the file in an unknown state.
func (w *Writer) forget() {
	w.end = -1
	w.order = w.order[:0]
	clear(w.index)
	w.last = nil
	w.count = 0
	w.seqs = nil
	w.seeded = false
}

// catchUp makes w.end the end of the last complete frame in the file of the
// given size, reading what other writers appended, and truncates a torn
// frame or zeros after it (scan); other bytes after it, or frames after an
// end-of-stream frame, are a [*DamageError], and the file is left as it
// is. whole is where a scan of the whole file, made under the same
// lock, found the records end (loadSeqs), or nil: a new writing run takes
// it instead of reading the file again.
func (w *Writer) catchUp(size int64, whole *scanEnd) error {
	if size == w.end {
		return nil
	}
	var se scanEnd
	var err error
	switch {
	case w.end >= 0:
		se, err = w.scan(w.end, size, func(r *Record) { w.track(&r.Frame, r.Checksum) })
	case whole != nil:
		// A new writing run: markers describe only what this run writes.
		se = *whole
	default:
		se, err = w.scanLast(size)
	}
	if err != nil {
		return err
	}
	end := se.next
	if end < size {
		if err := w.f.Truncate(end); err != nil {
			return fmt.Errorf("streamfile: truncate the tail of %s at %d: %w", w.f.Name(), end, err)
		}
		switch {
		case se.zeros:
			w.log.Warn("removed the zero bytes a crash left after the last frame (and a torn frame before them, if any)", "file", w.f.Name(), "offset", end, "bytes", size-end)
		case se.torn > 0:
			w.log.Warn("removed an incomplete record at the end of the file, which a writer left when it stopped in the middle of an append (a torn tail): that record is lost",
				"file", w.f.Name(), "offset", size-se.torn, "bytes", se.torn)
		}
	}
	w.end = end
	if w.atBoundary(end) {
		// The file ends on a boundary without its beacon: write it.
		b := appendBeacon(nil, &Beacon{})
		if _, err := w.f.WriteAt(b, end); err != nil {
			// Not caught up: the next batch looks at the file again, and
			// writes the beacon before any frame.
			w.forget()
			return fmt.Errorf("streamfile: write beacon of %s at %d: %w", w.f.Name(), end, err)
		}
		w.end += int64(len(b))
	}
	return nil
}

func (w *Writer) atBoundary(off int64) bool { return off > 0 && off%w.interval == 0 }

// DamageError reports a file whose records readers reach do not reach its
// end: an end-of-stream frame that is not the last frame, or bytes after
// the last good frame that are neither a torn frame nor zeros (after the
// first bytes of a torn frame, from a page boundary on). A writer
// refuses to append to it, since no reader would reach what it wrote.
// Truncating the file at Offset ([Repair]) makes it appendable, discarding
// the bytes from there.
type DamageError struct {
	File   string
	Offset int64 // where readers stop
	Size   int64
	What   string // what is at Offset
}

func (e *DamageError) Error() string {
	return fmt.Sprintf("streamfile: %s: readers stop at offset %d of %d bytes: %s; nothing was written (truncating the file at %d makes it appendable, discarding %d bytes: `streamd repair %s` does so after saying what it discards)",
		e.File, e.Offset, e.Size, e.What, e.Offset, e.Size-e.Offset, e.File)
}

// scanEnd is where [Writer.scan] found the readable records of a file end.
type scanEnd struct {
	next  int64 // where the next frame goes
	zeros bool  // the bytes from next to the end are zeros (a crash's leftovers)
	torn  int64 // else, how many bytes of a torn frame end the file
}

// scan reads the frames from start to size and returns where the next frame
// goes: after the last good frame (and a complete beacon that follows it),
// or at the start of a trailing end-of-stream frame. A torn frame or zeros
// may follow it; an end-of-stream frame followed by another frame, or other
// bytes after the last good frame, are a [*DamageError]. A frame whose
// checksum does not match its payload, followed by good frames, is kept:
// its framing is intact and readers step over it.
func (w *Writer) scan(start, size int64, each func(*Record)) (scanEnd, error) {
	d := NewDecoder(w.f, w.hdr, start)
	good := start    // after the last good frame (an end-of-stream frame included) and a beacon after it
	eos := int64(-1) // start of the end-of-stream frame, while it is the last frame read
	var damage error // the first bad frame after good
	for {
		r, err := d.Next()
		var ce *ChecksumError
		switch {
		case err == nil && eos >= 0:
			return scanEnd{}, w.damage(eos, size, fmt.Sprintf("an end-of-stream frame, followed by a frame at offset %d (key %q, seq %d) that no reader reaches", r.Offset, r.Key, r.Seq))
		case err == nil:
			damage, good = nil, r.End
			if r.IsEOS() {
				eos = r.Offset
				d = NewDecoder(w.f, w.hdr, r.End)
				break
			}
			if each != nil {
				each(r)
			}
		case errors.As(err, &ce):
			if damage == nil {
				damage, good = err, ce.Offset // past a beacon before the frame
			}
		case errors.Is(err, io.EOF):
			if damage == nil {
				good = d.Pos() // past a complete beacon after the last frame
			}
			return w.tail(good, eos, size, damage)
		case errors.Is(err, ErrTruncated):
			if damage == nil {
				// Past a complete beacon after the last frame: another
				// writer's end may be there, and the next frame too.
				good = d.Pos()
				damage = tornFrame(w.f, w.interval, good, size)
			}
			return w.tail(good, eos, size, damage)
		default:
			var fe *FormatError
			if !errors.As(err, &fe) {
				return scanEnd{}, fmt.Errorf("streamfile: cannot append to %s: %w", w.f.Name(), err)
			}
			if damage == nil {
				damage = err
			}
			return w.tail(good, eos, size, damage)
		}
	}
}

// tail judges what follows the last good frame, which ends at good (and is
// the end-of-stream frame at eos, when eos is not -1): nothing, a torn
// frame, zeros to the end, a torn frame whose last pages are zeros, or
// damage.
func (w *Writer) tail(good, eos, size int64, damage error) (scanEnd, error) {
	next := good
	if eos >= 0 {
		next = eos
	}
	if damage == nil {
		return scanEnd{next: next, torn: size - good}, nil // nothing after it, or a torn frame
	}
	leftovers, err := CrashLeftovers(w.f, w.interval, good, size)
	if err != nil {
		return scanEnd{}, fmt.Errorf("%w (%s)", err, w.f.Name())
	}
	if leftovers {
		return scanEnd{next: next, zeros: true}, nil
	}
	return scanEnd{}, w.damage(good, size, damage.Error())
}

// CrashLeftovers reports whether the bytes of f from off, where its last
// good frame ends, to size are what a crash can leave there: zeros in
// place of the pages of an append that never reached the disk, all of it,
// or its pages after the first bytes of a torn frame (which may end in
// zeros of its own). interval is the file's beacon interval. A writer
// removes them before it appends; a follower waits there, as at a torn
// frame, rather than read them as corrupt frames.
func CrashLeftovers(f io.ReaderAt, interval, off, size int64) (bool, error) {
	z, err := zerosFrom(f, off, size)
	if err != nil {
		return false, err
	}
	page := int64(os.Getpagesize())
	p := (z + page - 1) / page * page
	return z == off || p < size && tornFrame(f, interval, off, p) == nil, nil
}

// tornFrame returns nil when the bytes of f from off to size can be the
// start of a frame an interrupted writer left (its key length, key and
// fields as far as they go), and a [*FormatError] saying why not
// otherwise. A complete frame among them proves them damage: a frame whose
// size field was damaged to run past the end of the file, with the frames
// after it, which a writer must not cut off as a torn tail. Other bytes
// that reach a boundary are taken as torn: a beacon lies among them.
func tornFrame(f io.ReaderAt, interval, off, size int64) error {
	if _, err := DamagedSize(f, interval, off, size); err != nil {
		return err
	}
	if off%interval == 0 || off/interval != size/interval {
		return nil
	}
	b := make([]byte, size-off)
	if _, err := f.ReadAt(b, off); err != nil {
		return fmt.Errorf("streamfile: read at %d: %w", off, err)
	}
	l := int(b[0])
	key := b[1:min(len(b), 1+l)]
	switch {
	case !validKeyBytes(key):
		return &FormatError{Offset: off, Reason: fmt.Sprintf("bytes that do not start a frame: invalid stream key %s", quoteKey(key))}
	case len(b) >= l+29 && binary.BigEndian.Uint64(b[l+17:]) > maxTimestampMs:
		return &FormatError{Offset: off, Reason: "bytes that do not start a frame: timestamp after year 9999"}
	case len(b) >= l+29 && int64(binary.BigEndian.Uint32(b[l+25:])) > int64(DefaultMaxPayload):
		return &FormatError{Offset: off, Reason: "bytes that do not start a frame: payload size over the decoder limit"}
	}
	return nil
}

// DamagedSize tells a damaged frame from a torn one, for a frame at off
// that runs past the end of the file at size (the decoder's
// [ErrTruncated]): writers append in order, so whole frames after it,
// reading on cleanly to size, prove its size field damaged. It returns the offset of the first whole frame
// after off and a [*FormatError] saying so; -1 and nil when none follows,
// as after a torn frame; -1 and the error of a failed read.
//
// A frame cut by the end of the file whose payload holds stream file
// bytes, frames that read on cleanly to that end, passes for damage: a
// writer then refuses the file rather than cut it, and a follower skips
// the frame (only once the file stopped growing there for a while).
func DamagedSize(r io.ReaderAt, interval, off, size int64) (int64, error) {
	next, err := WholeFrameAfter(r, interval, off, size)
	if err != nil || next < 0 {
		return -1, err
	}
	return next, &FormatError{Offset: off, Reason: fmt.Sprintf("a frame that runs past the end of the file, yet a whole frame follows at offset %d: a damaged frame, not a torn one", next)}
}

// WholeFrameAfter returns the offset of the first frame of f that starts
// after off and ends by size, with a valid key and fields, its trailer and
// a matching checksum, from which the frames read on cleanly to size (a
// torn or end-of-stream frame may end them); -1 when there is none.
// Frames that a beacon cuts are not looked for: one whole frame is enough
// to tell damage from a torn tail, and a reader past damaged bytes finds
// the frames a beacon cuts through the beacon ([FrameBoundaryAfter]). It
// reads the bytes once, in blocks, and a candidate's payload in blocks
// too, so its memory stays small whatever the sizes claim. A whole frame
// inside another frame's payload passes for one only if frames follow it
// cleanly to size too, as when a payload holds stream file bytes.
func WholeFrameAfter(f io.ReaderAt, interval, off, size int64) (int64, error) {
	const block = 64 << 10
	const maxFields = 1 + 255 + 28 // key length byte, longest key, shard, seq, timestamp, size
	buf := make([]byte, block+maxFields)
	for start := off + 1; start < size; start += block {
		b := buf[:min(int64(len(buf)), size-start)]
		if _, err := f.ReadAt(b, start); err != nil {
			return -1, fmt.Errorf("streamfile: read at %d: %w", start, err)
		}
		for i := range min(block, len(b)) {
			p := start + int64(i)
			ok, err := frameAt(f, interval, b[i:], p, size)
			if err == nil && ok {
				ok, err = readsOnCleanly(f, interval, p, size)
			}
			if err != nil || ok {
				return p, err
			}
		}
	}
	return -1, nil
}

// readsOnCleanly reports whether the frames of f from offset p read without
// damage up to size: to its end, or to a torn or end-of-stream frame.
func readsOnCleanly(f io.ReaderAt, interval, p, size int64) (bool, error) {
	d := NewDecoder(io.NewSectionReader(f, 0, size), Header{BeaconInterval: uint32(interval)}, p)
	for {
		_, err := d.Next()
		var ce *ChecksumError
		var fe *FormatError
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, ErrTruncated), errors.Is(err, ErrEndOfStream):
			return true, nil
		case errors.As(err, &ce), errors.As(err, &fe):
			return false, nil
		default:
			return false, err
		}
	}
}

// frameAt reports whether a whole frame, not cut by a beacon, starts at
// offset p of f (whose bytes from p begin with b) and ends by size, with a
// valid key and fields, its trailer and a matching checksum.
func frameAt(f io.ReaderAt, interval int64, b []byte, p, size int64) (bool, error) {
	l := int(b[0])
	if len(b) < l+29 || p%interval == 0 {
		return false, nil
	}
	n := int64(binary.BigEndian.Uint32(b[l+25:]))
	end := p + int64(l) + frameOverhead + n
	switch {
	case binary.BigEndian.Uint64(b[l+17:]) > maxTimestampMs, n > DefaultMaxPayload, end > size,
		(end-1)/interval != p/interval, !validKeyBytes(b[1 : 1+l]):
		return false, nil
	}
	if whole := end - p; whole <= int64(len(b)) {
		// In the block read: no read per candidate (a run of zeros is
		// one candidate per byte).
		return b[whole-1] == trailer && CRC16(b[l+29:l+29+int(n)]) == binary.BigEndian.Uint16(b[whole-3:]), nil
	}
	var tail [3]byte // checksum and trailer
	if _, err := f.ReadAt(tail[:], end-3); err != nil {
		return false, fmt.Errorf("streamfile: read at %d: %w", end-3, err)
	}
	if tail[2] != trailer {
		return false, nil
	}
	crc, at := uint16(CRCInit), p+int64(l)+29
	var chunk [8 << 10]byte
	for at < end-3 {
		c := chunk[:min(int64(len(chunk)), end-3-at)]
		if _, err := f.ReadAt(c, at); err != nil {
			return false, fmt.Errorf("streamfile: read at %d: %w", at, err)
		}
		crc, at = UpdateCRC16(crc, c), at+int64(len(c))
	}
	return crc == binary.BigEndian.Uint16(tail[:2]), nil
}

// damage returns the DamageError of the file at offset, showing the first
// bytes there.
func (w *Writer) damage(offset, size int64, what string) error {
	b := make([]byte, min(16, size-offset))
	n, _ := w.f.ReadAt(b, offset)
	return &DamageError{File: w.f.Name(), Offset: offset, Size: size, What: fmt.Sprintf("%s (bytes there: % x)", what, b[:n])}
}

// zerosFrom returns where the zeros that end the bytes of f from off to
// end begin: end when the last byte is not zero, off when all are zeros.
func zerosFrom(f io.ReaderAt, off, end int64) (int64, error) {
	buf := make([]byte, 64<<10)
	for end > off {
		n := min(int64(len(buf)), end-off)
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return 0, fmt.Errorf("streamfile: read at %d: %w", end-n, err)
		}
		for i := n - 1; i >= 0; i-- {
			if buf[i] != 0 {
				return end - n + i + 1, nil
			}
		}
		end -= n
	}
	return off, nil
}

// scanLast returns where the readable records of the file of the given size
// end, as scan does, for a new writing run: markers describe only what this
// run writes, so the scan starts at a frame boundary before the last frame
// (lastFrameStart), not at the header.
func (w *Writer) scanLast(size int64) (scanEnd, error) {
	start, err := w.lastFrameStart(size)
	if err != nil {
		return scanEnd{}, err
	}
	se, err := w.scan(start, size, nil)
	if err == nil && se.zeros && start > HeaderSize {
		// Zeros may span beacon boundaries, where they pass for empty
		// beacons and the scan may have started inside them: find the
		// last good frame from the start.
		return w.scan(HeaderSize, size, nil)
	}
	return se, err
}

// lastFrameStart returns a frame boundary before the last complete frame of
// a file of the given size, found through the last beacons (spec §11.3,
// stepping back as §10 describes), so that appending does not read the whole
// file.
func (w *Writer) lastFrameStart(size int64) (int64, error) {
	for b := size - size%w.interval; b >= w.interval; b -= w.interval {
		if p, err := CheckedBoundary(w.f, w.hdr, b); err != nil || p > size {
			continue // a beacon being written, or a damaged one: the one before it
		}
		// Start one beacon earlier, so that the scan sees the frame this
		// beacon interrupts (it may be an end-of-stream frame, which is
		// shorter than any interval); at the header when that one is
		// damaged.
		if b -= w.interval; b >= w.interval {
			if p, err := CheckedBoundary(w.f, w.hdr, b); err == nil {
				return p, nil
			}
		}
		return HeaderSize, nil
	}
	return HeaderSize, nil
}

// loadSeqs scans the whole file of the given size once for the highest
// sequence of every stream, so that Publish continues them, unless it did
// already. It returns where that scan found the records end (see scan), or
// nil when it did not scan; w.seqs is set only when the scan succeeds.
func (w *Writer) loadSeqs(size int64) (*scanEnd, error) {
	if w.seqs != nil {
		return nil, nil
	}
	seqs := make(map[streamShard]seqInfo)
	se, err := w.scan(HeaderSize, size, func(r *Record) {
		k := streamShard{r.Key, r.Shard}
		if s, ok := seqs[k]; !ok || r.Seq >= s.seq {
			seqs[k] = seqInfo{seq: r.Seq, ts: r.TimestampMs, checksum: r.Checksum}
		}
	})
	if err != nil {
		return nil, err
	}
	w.seqs = seqs
	return &se, nil
}

// addEntry adds the marker entry of a stream, in key and shard order.
func (w *Writer) addEntry(m markerEntry) *markerEntry {
	e := &m
	w.index[e.streamShard] = e
	i, _ := slices.BinarySearchFunc(w.order, e.streamShard, func(e *markerEntry, k streamShard) int {
		if c := cmp.Compare(e.key, k.key); c != 0 {
			return c
		}
		return cmp.Compare(e.shard, k.shard)
	})
	w.order = slices.Insert(w.order, i, e)
	return e
}

// seed gives the stream of f, the first frame this writing run publishes,
// the marker entry the upstream writer starts an append with (spec §10
// step 8): the highest sequence of the stream in the file, that frame's
// timestamp, and its payload checksum as the running checksum. The other
// streams of the file start with a fresh running checksum.
func (w *Writer) seed(f *Frame) {
	w.seeded = true
	k := streamShard{f.Key, f.Shard}
	if s, ok := w.seqs[k]; ok && w.index[k] == nil {
		w.addEntry(markerEntry{streamShard: k, seq: s.seq, ts: s.ts, running: s.checksum})
	}
}

// track updates the marker entry and the sequence of the frame's stream, at
// the start of writing the frame (spec §6.3).
func (w *Writer) track(f *Frame, checksum uint16) {
	k := streamShard{f.Key, f.Shard}
	e := w.last
	if e == nil || e.streamShard != k {
		e = w.index[k]
	}
	if e == nil {
		e = w.addEntry(markerEntry{streamShard: k, seq: f.Seq, ts: f.TimestampMs, running: CRCInit})
	}
	e.seq = max(e.seq, f.Seq)
	e.ts = max(e.ts, f.TimestampMs)
	w.last = e
	t := &crcTables[0]
	e.running = t[byte(e.running>>8)^byte(checksum>>8)] ^ e.running<<8
	e.running = t[byte(e.running>>8)^byte(checksum)] ^ e.running<<8
	if w.seqs != nil {
		if s := w.seqs[k]; f.Seq >= s.seq {
			w.seqs[k] = seqInfo{seq: f.Seq, ts: f.TimestampMs, checksum: checksum}
		}
	}
}

// encode appends f to w.buf, splicing in a beacon at every boundary reached,
// and returns the length of w.buf after the frame's last byte (before the
// beacon that follows a frame ending on a boundary). The payload is copied
// once, straight into the batch buffer.
func (w *Writer) encode(f *Frame) int {
	sum := CRC16(f.Payload)
	w.track(f, sum)
	left := f.Size()
	if off := w.end + int64(len(w.buf)); left < w.interval-off%w.interval {
		// Most frames end before the next boundary (one that ends on it is
		// followed by a beacon): no beacon to splice in.
		w.buf = appendFrameHead(w.buf, f)
		w.buf = append(w.buf, f.Payload...)
		w.buf = append(w.buf, byte(sum>>8), byte(sum), trailer)
		return len(w.buf)
	}
	var headBuf [1 + 255 + 28]byte
	head := appendFrameHead(headBuf[:0], f)
	tail := [3]byte{byte(sum >> 8), byte(sum), trailer}
	w.emit(head, &left)
	w.emit(f.Payload, &left)
	return w.emit(tail[:], &left)
}

// emit appends frame bytes p to w.buf, writing a beacon whenever the offset
// reaches a boundary; left counts the frame's bytes not yet emitted. It
// returns the length of w.buf after the last byte of p, before a beacon
// that follows it.
func (w *Writer) emit(p []byte, left *int64) int {
	off := w.end + int64(len(w.buf))
	end := len(w.buf)
	for len(p) > 0 {
		n := min(int64(len(p)), w.interval-off%w.interval)
		w.buf = append(w.buf, p[:n]...)
		end = len(w.buf)
		p = p[n:]
		off += n
		*left -= n
		if off%w.interval == 0 {
			w.fillBeacon(uint32(*left))
			before := len(w.buf)
			w.buf = appendBeacon(w.buf, &w.beacon)
			off += int64(len(w.buf) - before)
		}
	}
	return end
}

// fillBeacon picks the markers of the next beacon round-robin over the
// ordered streams (spec §6.3).
func (w *Writer) fillBeacon(remaining uint32) {
	b := &w.beacon
	b.Remaining = remaining
	b.Markers = b.Markers[:0]
	n := len(w.order)
	if n == 0 {
		return
	}
	take := min(n, w.perBeacon)
	first := int(w.count % uint64(n))
	for i := range take {
		e := w.order[(first+i)%n]
		b.Markers = append(b.Markers, Marker{Key: e.key, Shard: e.shard, Seq: e.seq, TimestampMs: e.ts, RunningChecksum: e.running})
	}
	w.count += uint64(take)
}
