package retrytimer

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/internal/failpoint"
)

// SpoolName is the name of the spool inside the spool directory.
const SpoolName = "retry.spool"

// spool is the open log file of a [Queue] in file mode. Its fields and
// methods are guarded by Queue.mu; the file itself changes only under
// Queue.syncMu as well (compaction and Close).
type spool struct {
	path    string
	f       *os.File
	size    int64  // length of the log; the next record is written here
	live    int64  // bytes of the schedule records of pending entries
	written uint64 // records appended since Open
}

// dead returns the bytes of the log that compaction would drop.
func (sp *spool) dead() int64 { return sp.size - int64(len(fileMagic)) - sp.live }

// append writes rec at the end of the log and returns its offset. A failed
// write (a full disk) is undone by truncating the part of rec it left, so
// the log stays as it was and later appends may succeed; if even that
// fails, the error is a *partialWriteError and the caller must stop
// writing.
func (sp *spool) append(rec []byte) (int64, error) {
	off := sp.size
	failpoint.TornWrite(failpoint.RetrytimerSpool, sp.f, rec, off) // crash tests: a torn record, the spool's torn tail
	if _, err := sp.f.WriteAt(rec, off); err != nil {
		if terr := sp.f.Truncate(off); terr != nil {
			return 0, &partialWriteError{errors.Join(err, terr)}
		}
		return 0, err
	}
	sp.size += int64(len(rec))
	sp.written++
	return off, nil
}

// partialWriteError is a failed append whose partial record could not be
// removed.
type partialWriteError struct{ err error }

func (e *partialWriteError) Error() string {
	return "write left a partial record that could not be removed: " + e.err.Error()
}

func (e *partialWriteError) Unwrap() error { return e.err }

// read returns e's schedule record, reusing *buf, after checking its
// checksums and that it schedules e.
func (sp *spool) read(e *entry, buf *[]byte) ([]byte, body, error) {
	n := int(e.recordSize())
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	rec := (*buf)[:n]
	if _, err := sp.f.ReadAt(rec, e.off); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%s: record at offset %d runs past the end of the file", sp.path, e.off)
		}
		return nil, body{}, err
	}
	h := parseHeader(rec)
	if !h.lenOK || h.n != e.size || checksum(rec[hdrSize:]) != h.bodyCRC {
		return nil, body{}, fmt.Errorf("%s: record at offset %d no longer matches its checksum", sp.path, e.off)
	}
	b, err := decodeBody(rec[hdrSize:])
	if err == nil && (!b.isSchedule() || b.id != e.id) {
		err = errors.New("not the expected schedule record")
	}
	if err != nil {
		return nil, body{}, fmt.Errorf("%s: record at offset %d: %w", sp.path, e.off, err)
	}
	return rec, b, nil
}

// openSpool opens the spool in dir, creating an empty one when there is
// none, and loads its pending entries. A torn tail is truncated away.
func openSpool(dir string, origins *originTable) (*spool, scanResult, int64, error) {
	sp := &spool{path: filepath.Join(dir, SpoolName)}
	if st, err := os.Stat(dir); err != nil {
		return nil, scanResult{}, 0, err
	} else if !st.IsDir() {
		return nil, scanResult{}, 0, fmt.Errorf("spool directory %s is not a directory", dir)
	}
	// A temporary file is a compaction that did not finish; the spool it
	// would have replaced is intact.
	if err := os.Remove(durable.TempPath(sp.path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, scanResult{}, 0, err
	}
	f, err := os.OpenFile(sp.path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		f, size, _, err := replaceFile(sp.path, nil)
		if err != nil {
			return nil, scanResult{}, 0, err
		}
		sp.f, sp.size = f, size
		return sp, scanResult{nextID: 1}, 0, nil
	}
	if err != nil {
		return nil, scanResult{}, 0, err
	}
	res, torn, err := loadFile(f, origins)
	if err == nil && torn > 0 {
		// A torn tail is an append that a crash cut short: it was never
		// acknowledged, since no fsync completed after it.
		err = f.Truncate(res.end)
		if err == nil {
			err = f.Sync()
		}
	}
	if err != nil {
		return nil, scanResult{}, 0, errors.Join(err, f.Close())
	}
	sp.f, sp.size, sp.live = f, res.end, res.live
	return sp, res, torn, nil
}

// Check reads the spool in dir as Open does, without opening it for
// writing: a corrupt spool, which Open refuses, is an error; a torn tail,
// which Open cuts, and a missing spool are not. For `streamd check-config`,
// while a daemon may be running.
func Check(dir string) error {
	f, err := os.Open(filepath.Join(dir, SpoolName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, err = loadFile(f, nil)
	return err
}

// loadFile scans f from its start and returns the scan and the size of the
// torn tail; the pending entries' origins are held in origins, unless nil.
func loadFile(f *os.File, origins *originTable) (scanResult, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return scanResult{}, 0, err
	}
	res, err := scan(bufio.NewReaderSize(f, 64<<10), st.Size(), origins)
	if err != nil {
		var ce *corruptError
		if errors.As(err, &ce) {
			return scanResult{}, 0, fmt.Errorf("corrupt spool %s at offset %d: %s "+
				"(move the file aside to start with an empty spool; the copies pending in it are then lost)",
				f.Name(), ce.off, ce.reason)
		}
		return scanResult{}, 0, err
	}
	return res, st.Size() - res.end, nil
}

// scanResult is what a scan of a spool finds.
type scanResult struct {
	entries []entry // pending entries, by id
	nextID  uint64  // the id for the next schedule record
	end     int64   // length of the intact log; what follows is a torn tail
	live    int64   // bytes of the schedule records of pending entries
}

// corruptError is damage found by scan other than a torn tail.
type corruptError struct {
	off    int64
	reason string
}

func (e *corruptError) Error() string {
	return fmt.Sprintf("offset %d: %s", e.off, e.reason)
}

// scan reads a spool of the given size from r. Damage that a crash in the
// middle of the last append can cause is a torn tail: scan stops there and
// reports its offset as end. Any other damage is a *corruptError; other
// errors come from r. The origins of the pending entries are held in
// origins, unless nil.
//
// A tail is torn when it is shorter than a record header, when its header is
// intact but its body runs past the end of the file, when its header is
// damaged and everything from it to the end is zero (a file extended but not
// written), or when it is the last record and its body checksum fails.
func scan(r io.Reader, size int64, origins *originTable) (scanResult, error) {
	magic := make([]byte, len(fileMagic))
	if size < int64(len(magic)) {
		return scanResult{}, &corruptError{0, "file too short for the header"}
	}
	if _, err := io.ReadFull(r, magic); err != nil {
		return scanResult{}, err
	}
	if string(magic) != fileMagic {
		return scanResult{}, &corruptError{0, fmt.Sprintf("bad header %q, want %q", magic, fileMagic)}
	}
	pending := make(map[uint64]entry)
	res := scanResult{nextID: 1}
	off := int64(len(magic))
	var hdr [hdrSize]byte
	var buf []byte
	for off < size {
		if size-off < hdrSize {
			break
		}
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return scanResult{}, err
		}
		h := parseHeader(hdr[:])
		if !h.lenOK {
			zero, err := restIsZero(hdr[:], r)
			if err != nil {
				return scanResult{}, err
			}
			if zero {
				break
			}
			return scanResult{}, &corruptError{off, "record header checksum mismatch"}
		}
		end := off + hdrSize + int64(h.n)
		if end > size {
			break
		}
		if cap(buf) < int(h.n) {
			buf = make([]byte, h.n)
		}
		b := buf[:h.n]
		if _, err := io.ReadFull(r, b); err != nil {
			return scanResult{}, err
		}
		if checksum(b) != h.bodyCRC {
			if end == size {
				break
			}
			return scanResult{}, &corruptError{off, "record body checksum mismatch"}
		}
		rec, err := decodeBody(b)
		if err != nil {
			return scanResult{}, &corruptError{off, err.Error()}
		}
		switch {
		case rec.isSchedule():
			if rec.id == math.MaxUint64 {
				return scanResult{}, &corruptError{off, "record id out of range"}
			}
			if _, dup := pending[rec.id]; dup {
				return scanResult{}, &corruptError{off, fmt.Sprintf("id %d scheduled twice", rec.id)}
			}
			e := entry{due: rec.due, delay: rec.delay, id: rec.id, off: off, size: h.n}
			if origins != nil {
				c := rec.copy()
				e.origin = origins.of(&c)
			}
			pending[rec.id] = e
			res.live += hdrSize + int64(h.n)
			res.nextID = max(res.nextID, rec.id+1)
		case rec.typ == recDone:
			e, ok := pending[rec.id]
			if !ok {
				return scanResult{}, &corruptError{off, fmt.Sprintf("done record for id %d, which is not pending", rec.id)}
			}
			delete(pending, rec.id)
			res.live -= e.recordSize()
			if origins != nil {
				origins.release(e.origin)
			}
		}
		off = end
	}
	res.end = off
	res.entries = make([]entry, 0, len(pending))
	for _, e := range pending {
		res.entries = append(res.entries, e)
	}
	slices.SortFunc(res.entries, func(a, b entry) int { return cmp.Compare(a.id, b.id) })
	return res, nil
}

// restIsZero reports whether first and everything left in r are zero bytes.
func restIsZero(first []byte, r io.Reader) (bool, error) {
	zero := func(b []byte) bool {
		for _, c := range b {
			if c != 0 {
				return false
			}
		}
		return true
	}
	if !zero(first) {
		return false, nil
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if !zero(buf[:n]) {
			return false, nil
		}
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// replaceFile writes fileMagic and then what fill writes (fill gets the
// offset it starts at and returns the offset it ends at) to a temporary file
// and replaces path with it, atomically and durably (see
// [durable.Replace]). It returns the new file, open for reading and
// writing, and its size. renamed reports whether path was replaced: after an
// error with renamed false, path is untouched and the temporary file is
// gone; after an error with renamed true, the rename may not be durable and
// no file is returned.
func replaceFile(path string, fill func(w io.Writer, off int64) (int64, error)) (f *os.File, size int64, renamed bool, err error) {
	renamed, err = durable.Replace(path, 0o600, func(tmp *os.File) error {
		w := bufio.NewWriterSize(tmp, 64<<10)
		_, err := w.WriteString(fileMagic)
		size = int64(len(fileMagic))
		if err == nil && fill != nil {
			size, err = fill(w, size)
		}
		if err == nil {
			err = w.Flush()
		}
		return err
	}, nil)
	if err != nil {
		return nil, 0, renamed, err
	}
	// Open by the final name, which errors then carry.
	if f, err = os.OpenFile(path, os.O_RDWR, 0); err != nil {
		return nil, 0, true, err
	}
	return f, size, true, nil
}
