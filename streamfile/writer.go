package streamfile

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

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
// Continuing a file (spec §10) differs from the upstream writer where the
// upstream behaviour is unsafe:
//   - a trailing end-of-stream frame is always overwritten, also in a file
//     shorter than one beacon interval (upstream leaves it in place there,
//     which ends every reader before the new frames);
//   - bytes after the last complete frame (a torn write, or the rest of an
//     overwritten end-of-stream frame) are truncated before writing, so the
//     file is never momentarily inconsistent;
//   - a file that ends on a boundary without its beacon gets the beacon
//     written, instead of being overwritten from offset 0;
//   - a complete beacon that follows the last frame is kept, not replaced by
//     an empty one.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	f              *os.File
	path           string // checked before each batch when refuseReplaced is set
	refuseReplaced bool
	hdr            Header
	interval       int64
	perBeacon      int

	end   int64 // where the next byte goes; -1 until read from the file
	order []*markerEntry
	index map[streamShard]*markerEntry
	last  *markerEntry // the entry of the previous frame, to skip the map lookup
	count uint64       // C of spec §6.3: markers written in this run

	seqs map[streamShard]seqInfo // highest sequence per stream; nil until scanned

	buf    []byte
	beacon Beacon
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
	// lock, would never see it. A path that is gone is no replacement.
	RefuseReplaced bool
}

// ErrReplaced is returned by a batch of a Writer opened with
// [CreateOptions.RefuseReplaced] when the path names another file now.
var ErrReplaced = errors.New("streamfile: the path names another file than the one open for writing")

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
	if err != nil {
		return nil, fmt.Errorf("streamfile: open for writing: %w", err)
	}
	w := &Writer{f: f, path: path, refuseReplaced: opts.RefuseReplaced, end: -1}
	err = w.locked(func() error { return w.init(opts) })
	if err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return w, nil
}

// openFile opens path with flags. A file it creates gets mode, when set,
// whatever the umask: it is created exclusively, so that the mode of a
// file another writer made is left alone.
func openFile(path string, flags int, mode fs.FileMode) (*os.File, error) {
	if flags&os.O_CREATE == 0 || mode == 0 {
		return os.OpenFile(path, flags, 0o644)
	}
	f, err := os.OpenFile(path, flags|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return os.OpenFile(path, flags&^os.O_CREATE, 0)
	}
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(mode); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// init reads the header of the file, or writes it into an empty file.
func (w *Writer) init(opts CreateOptions) error {
	size, err := w.size()
	if err != nil {
		return err
	}
	if size == 0 {
		if !opts.Create {
			return fmt.Errorf("streamfile: %s is empty and creating it was not allowed", w.f.Name())
		}
		w.setHeader(opts.Header)
		b, _ := AppendHeader(nil, &opts.Header)
		if w.interval == HeaderSize {
			b = appendBeacon(b, &Beacon{}) // spec §3: the header ends on the first boundary
		}
		if _, err := w.f.WriteAt(b, 0); err != nil {
			return fmt.Errorf("streamfile: write header of %s: %w", w.f.Name(), err)
		}
		w.end = int64(len(b))
		return nil
	}
	h, err := ReadHeader(w.f)
	if errors.Is(err, ErrTruncated) {
		return fmt.Errorf("streamfile: %s has an incomplete %d-byte header: a writer died while creating it; remove the file", w.f.Name(), size)
	}
	if err != nil {
		return fmt.Errorf("streamfile: %s: %w", w.f.Name(), err)
	}
	w.setHeader(h)
	return nil
}

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

// Sync flushes the file to stable storage.
func (w *Writer) Sync() error {
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("streamfile: fsync %s: %w", w.f.Name(), err)
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
// ([ReservedKey]) writes nothing.
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
	}
	return w.locked(func() error {
		if w.refuseReplaced {
			if err := w.checkPath(); err != nil {
				return err
			}
		}
		if err := w.catchUp(); err != nil {
			return err
		}
		if assignSeq {
			if err := w.loadSeqs(); err != nil {
				return err
			}
		}
		w.buf = w.buf[:0]
		for i := range frames {
			f := &frames[i]
			if assignSeq {
				f.Seq = w.seqs[streamShard{f.Key, f.Shard}].seq + 1
			}
			w.encode(f)
		}
		failpoint.TornWrite(failpoint.StreamfileAppend, w.f, w.buf, w.end) // crash tests: a torn batch, under the flock, before any fsync
		if _, err := w.f.WriteAt(w.buf, w.end); err != nil {
			w.forget()
			return fmt.Errorf("streamfile: append to %s at offset %d: %w", w.f.Name(), w.end, err)
		}
		w.end += int64(len(w.buf))
		return nil
	})
}

// checkPath returns ErrReplaced when the path names another file than the
// open one.
func (w *Writer) checkPath() error {
	at, err := os.Stat(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("streamfile: %w", err)
	}
	open, err := w.f.Stat()
	if err != nil {
		return fmt.Errorf("streamfile: stat %s: %w", w.f.Name(), err)
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
}

// catchUp makes w.end the end of the last complete frame in the file, reading
// what other writers appended, and truncates anything after it.
func (w *Writer) catchUp() error {
	size, err := w.size()
	if err != nil {
		return err
	}
	if size == w.end {
		return nil
	}
	if w.end >= 0 && size < w.end {
		return fmt.Errorf("streamfile: %s shrank from %d to %d bytes while open for writing: another process truncated or replaced it", w.f.Name(), w.end, size)
	}
	start, track := w.end, func(r *Record) { w.track(&r.Frame, r.Checksum) }
	if start < 0 {
		// A new writing run: markers describe only what this run writes.
		if start, err = w.lastFrameStart(size); err != nil {
			return err
		}
		track = nil
	}
	end, err := w.scan(start, track)
	if err != nil {
		return err
	}
	if end < size {
		if err := w.f.Truncate(end); err != nil {
			return fmt.Errorf("streamfile: truncate torn tail of %s at %d: %w", w.f.Name(), end, err)
		}
	}
	w.end = end
	if w.atBoundary(end) {
		// The file ends on a boundary without its beacon: write it.
		b := appendBeacon(nil, &Beacon{})
		if _, err := w.f.WriteAt(b, end); err != nil {
			return fmt.Errorf("streamfile: write beacon of %s at %d: %w", w.f.Name(), end, err)
		}
		w.end += int64(len(b))
	}
	return nil
}

func (w *Writer) atBoundary(off int64) bool { return off > 0 && off%w.interval == 0 }

// scan reads complete frames from start and returns the offset where the
// next frame goes: after the last complete frame (and a complete beacon that
// follows it), or at the start of a trailing end-of-stream frame. Frames after
// an end-of-stream frame in the middle of the file are read too.
func (w *Writer) scan(start int64, each func(*Record)) (int64, error) {
	d := NewDecoder(w.f, w.hdr, start)
	eos := int64(-1) // start of the end-of-stream frame, while it is the last frame read
	for {
		r, err := d.Next()
		var ce *ChecksumError
		switch {
		case err == nil && r.IsEOS():
			eos = r.Offset
			d = NewDecoder(w.f, w.hdr, r.End)
		case err == nil:
			eos = -1
			if each != nil {
				each(r)
			}
		case errors.As(err, &ce):
			eos = -1 // framing intact: the frame stays
		case errors.Is(err, io.EOF), errors.Is(err, ErrTruncated):
			if eos >= 0 {
				return eos, nil
			}
			return d.Pos(), nil
		default:
			return 0, fmt.Errorf("streamfile: cannot append to %s: %w", w.f.Name(), err)
		}
	}
}

// lastFrameStart returns a frame boundary before the last complete frame of
// a file of the given size, found through the last beacons (spec §11.3,
// stepping back as §10 describes), so that appending does not read the whole
// file.
func (w *Writer) lastFrameStart(size int64) (int64, error) {
	d := NewDecoder(w.f, w.hdr, HeaderSize)
	for b := size - size%w.interval; b >= w.interval; b -= w.interval {
		p, err := d.resync(b)
		if err == nil && p <= size {
			// Start one beacon earlier, so that the scan sees the frame
			// this beacon interrupts (it may be an end-of-stream frame,
			// which is shorter than any interval).
			if b -= w.interval; b < w.interval {
				return HeaderSize, nil
			}
			return d.resync(b)
		}
		var fe *FormatError
		if errors.As(err, &fe) {
			return 0, fmt.Errorf("streamfile: cannot append to %s: %w", w.f.Name(), err)
		}
	}
	return HeaderSize, nil
}

// loadSeqs scans the whole file once for the highest sequence of every
// stream, so that Publish continues them.
func (w *Writer) loadSeqs() error {
	if w.seqs != nil {
		return nil
	}
	w.seqs = make(map[streamShard]seqInfo)
	_, err := w.scan(HeaderSize, func(r *Record) {
		k := streamShard{r.Key, r.Shard}
		if s, ok := w.seqs[k]; !ok || r.Seq >= s.seq {
			w.seqs[k] = seqInfo{seq: r.Seq, ts: r.TimestampMs, checksum: r.Checksum}
		}
	})
	return err
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
		e = &markerEntry{streamShard: k, seq: f.Seq, ts: f.TimestampMs, running: CRCInit}
		w.index[k] = e
		i, _ := slices.BinarySearchFunc(w.order, k, func(e *markerEntry, k streamShard) int {
			if c := cmp.Compare(e.key, k.key); c != 0 {
				return c
			}
			return cmp.Compare(e.shard, k.shard)
		})
		w.order = slices.Insert(w.order, i, e)
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

// encode appends f to w.buf, splicing in a beacon at every boundary reached.
// The payload is copied once, straight into the batch buffer.
func (w *Writer) encode(f *Frame) {
	sum := CRC16(f.Payload)
	w.track(f, sum)
	left := f.Size()
	if off := w.end + int64(len(w.buf)); left < w.interval-off%w.interval {
		// Most frames end before the next boundary (one that ends on it is
		// followed by a beacon): no beacon to splice in.
		w.buf = appendFrameHead(w.buf, f)
		w.buf = append(w.buf, f.Payload...)
		w.buf = append(w.buf, byte(sum>>8), byte(sum), trailer)
		return
	}
	var headBuf [1 + 255 + 28]byte
	head := appendFrameHead(headBuf[:0], f)
	tail := [3]byte{byte(sum >> 8), byte(sum), trailer}
	w.emit(head, &left)
	w.emit(f.Payload, &left)
	w.emit(tail[:], &left)
}

// emit appends frame bytes p to w.buf, writing a beacon whenever the offset
// reaches a boundary; left counts the frame's bytes not yet emitted.
func (w *Writer) emit(p []byte, left *int64) {
	off := w.end + int64(len(w.buf))
	for len(p) > 0 {
		n := min(int64(len(p)), w.interval-off%w.interval)
		w.buf = append(w.buf, p[:n]...)
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
