package tail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/streamd/streamd/internal/durable"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/streamfile"
)

// This file holds how a follower notices that the file it reads is not the
// one at its path any more, or not the one it was: truncated or rewritten
// in place, replaced by another file, removed. See "Following" in the
// package documentation.

// replaceState is what a follower knows of the path when it does not name
// the open file.
type replaceState struct {
	draining  bool      // the path names another file: read this one to its end, then switch
	drainSize int64     // the old file's size when the path was seen not naming it, then at each look under a shared lock
	grew      time.Time // when the old file was last seen growing, or the switch was noticed
	// leftAt is when the path was first seen not naming the open file
	// (local clock), kept through a moment with no file at the path and
	// the rotations after it; zero while the path names it.
	leftAt time.Time
	// namedAt is when a look last began that found the path naming the
	// open file (zero before one): another file took the path after it.
	namedAt time.Time
	drained int64 // records read from the old file since the switch was noticed
	removed bool  // the path is gone
	missing ratelog.Limiter
	// told: EventReplaced was told for the file at the path, unopened,
	// which replaced the open one and could not be opened (nil if it
	// could not be looked at either).
	told     bool
	unopened os.FileInfo
	// openTrouble: the file that replaced the one read cannot be opened.
	// It is tried again until it can.
	openTrouble ratelog.Trouble
	// readUpTo is the latest creation time (header) of the files read:
	// the next rotated file was created after it.
	readUpTo uint64
	// nextTrouble: the directory cannot be looked at for the next
	// rotated file.
	nextTrouble ratelog.Trouble
	// left is the stream files the follower switched away from lately,
	// the latest last, and where it left each: one back at the path (a
	// rename undone after another file sat there a while) is read on from
	// there, not from its beginning again.
	left []leftFile
	// seen is the files seen at the path while the open one was read to
	// its end, in the order seen, open: a symlink at the path retargeted,
	// or a file renamed over it, twice within the grace leaves a file in
	// between that neither the path nor the rotations of the directory
	// (NextRotated, by the name in the header) lead to. It is read after
	// the open one, before the file now at the path.
	seen     []seenFile
	seenFull bool // seen is full, which was said
}

// seenFile is a file seen at the path (replaceState.seen): open, its stat
// information when seen, and its name then (a symlink's target).
type seenFile struct {
	f    file
	fi   os.FileInfo
	name string
}

// maxSeen bounds replaceState.seen.
const maxSeen = 4

// leftFile is a stream file a follower switched away from: which (fi, for
// the device too), where to read it on (where it left it, or the end of
// the last record when it was passing over damaged bytes there), and the
// last record it read of it, which must read the same for the file to be
// read on there.
type leftFile struct {
	id     streamfile.Identity
	fi     os.FileInfo
	offset int64
	last   lastRecord
}

// lastRecord is where the last record read of a file was, and what tells
// it from another record written there since (its sequence, timestamp
// and checksum).
type lastRecord struct {
	offset, end int64
	seq         uint64
	tag         uint64
}

// lastRecordOf is the lastRecord of rec.
func lastRecordOf(rec *streamfile.Record) lastRecord {
	return lastRecord{offset: rec.Offset, end: rec.End, seq: rec.Seq, tag: rec.TimestampMs<<16 | uint64(rec.Checksum)}
}

// maxLeft bounds replaceState.left.
const maxLeft = 4

// leave remembers the file the follower leaves.
func (r *replaceState) leave(l leftFile) {
	r.left = slices.DeleteFunc(r.left, func(o leftFile) bool { return o.id == l.id })
	if len(r.left) == maxLeft {
		r.left = slices.Delete(r.left, 0, 1)
	}
	r.left = append(r.left, l)
}

// takeBack returns the file of identity id and stat information fi, if the
// follower left it lately, and forgets it; else one it left lately with the
// same header (name and creation time) under another inode, of which the
// file is a copy (cp -p then mv over the path, a restore), if the records
// read of it read the same there too (backAt). It reports which.
func (r *replaceState) takeBack(id streamfile.Identity, fi os.FileInfo) (l leftFile, copied, ok bool) {
	i := slices.IndexFunc(r.left, func(l leftFile) bool { return l.id == id && os.SameFile(l.fi, fi) })
	if i < 0 {
		copied = true
		i = slices.IndexFunc(r.left, func(l leftFile) bool {
			return l.id.FileName == id.FileName && l.id.CreatedAtMs == id.CreatedAtMs && !os.SameFile(l.fi, fi)
		})
	}
	if i < 0 {
		return leftFile{}, false, false
	}
	l = r.left[i]
	r.left = slices.Delete(r.left, i, i+1)
	return l, copied, true
}

// followHeld makes the held file (*held, which it takes) the open one when
// no file is at the path (a file rotated away and removed before the next
// was made, logrotate's nocreate): it is Options.Resume's, and read on from
// the position while the follower waits for a file at the path. It
// reports false when the held file is not of use.
func (fl *Follower) followHeld(held **os.File) bool {
	f, r := *held, fl.opts.Resume
	if f == nil || r == nil || fl.opts.Replay {
		return false
	}
	if heldSize(f, *r) < r.Offset {
		return false
	}
	*held = nil
	fl.f = fl.timed(f)
	fl.log.Info("no file is at the path: reading the file of the stored position, held open since it was read, on from the position, and waiting for a file at the path",
		"offset", r.Offset, "ino", r.File.Ino)
	return true
}

// heldSize returns the size of the held file f when it is the file of the
// stored position r, else -1.
func heldSize(f *os.File, r Position) int64 {
	if _, size, id, err := streamfile.Identify(f); err == nil && id == r.File {
		return size
	}
	return -1
}

// resumeRotated opens, in place of the file at the path, the file the
// stored position belongs to when it is not at the path any more: the one
// held open by the run before (Options.Held, of which it takes ownership),
// else one a rotation renamed within the directory while nothing followed
// the path, or else a copy of it there when it was truncated in place after
// the copy was made (logrotate's copytruncate): the follower then reads it
// on from the position, and check finds that the path names another file,
// which switchFile goes on with (through the files rotated after it) once
// this one is read to its end and has stopped growing. A file that cannot
// be found leaves the file at the path, which startOffset then reads from
// its beginning. It returns how the file was found, 0 for none.
func (fl *Follower) resumeRotated(held **os.File) found {
	r := fl.opts.Resume
	if r == nil || fl.opts.Replay {
		return 0
	}
	f, found, err := fl.locateResume(*r, held)
	if err != nil {
		fl.log.Warn("cannot look for the file the stored position belongs to in the directory of the path", "err", err)
		return 0
	}
	if f == nil {
		return 0
	}
	fi, ok := fl.drainInstead(f)
	if !ok {
		return 0
	}
	switch found {
	case foundHeld:
		fl.log.Info("the stored position is in a file rotated away from the path, held open since it was read: reading it on to its end, then the files rotated after it and the file at the path",
			"offset", r.Offset, "ino", r.File.Ino)
	case foundRenamed:
		fl.log.Info("the stored position is in a file rotated away from the path while nothing followed it: reading it on to its end, then the files rotated after it and the file at the path",
			"rotated_path", f.Name(), "offset", r.Offset, "ino", r.File.Ino)
	case foundCopy:
		// The position holds in the copy: its bytes are the file's.
		id := r.File
		id.Ino = streamfile.Inode(fi)
		fl.opts.Resume = &Position{File: id, Offset: r.Offset}
		if st, err := os.Stat(fl.path); err == nil && os.SameFile(st, fi) {
			fl.log.Info("the file at the path is a copy of the file of the stored position (the same header and bytes, another inode: cp -p then mv, a restore): reading it on from the position",
				"offset", r.Offset, "ino", id.Ino, "old_ino", r.File.Ino)
			return found
		}
		fl.log.Info("the file of the stored position was truncated in place after a copy of it was made (copytruncate) while nothing followed it: reading the copy on to its end, then the file at the path",
			"copy_path", f.Name(), "offset", r.Offset, "ino", r.File.Ino)
	}
	return found
}

// seeHeldAfter takes the files *after (Options.HeldAfter), read after the
// held file the follower reads in place of the file at the path, as files
// seen at the path (replaceState.seen): openNext goes on with them, in
// order, before the file at the path. The open file, and a file given
// twice, are not seen again.
func (fl *Follower) seeHeldAfter(after *[]*os.File) {
	r := &fl.replace
	open, _ := fl.f.Stat()
	for _, f := range *after {
		fi, err := f.Stat()
		if err != nil || open != nil && os.SameFile(open, fi) || slices.ContainsFunc(r.seen, func(s seenFile) bool { return os.SameFile(s.fi, fi) }) {
			f.Close()
			continue
		}
		// The descriptor's name is the path it was opened by, which
		// another file may hold now: the inode and the header name it.
		ino := streamfile.Inode(fi)
		r.seen = append(r.seen, seenFile{f: fl.timed(f), fi: fi, name: fmt.Sprintf("ino %d, held open since it was read at %s", ino, f.Name())})
		h, err := streamfile.ReadHeader(f)
		if err != nil {
			fl.log.Warn("a file read after the one of the stored position, held open since it was read, is read after it; its header cannot be read",
				"ino", ino, "err", err)
			continue
		}
		fl.log.Info("a file read after the one of the stored position, held open since it was read, is read after it",
			"ino", ino, "file_name", h.FileName, "created_at_ms", h.CreatedAtMs)
	}
	*after = nil
}

// How locateResume found the file of a stored position.
type found int

const (
	foundHeld    found = iota + 1 // Options.Held
	foundRenamed                  // in the directory, by its inode
	foundCopy                     // a copy in the directory (copytruncate)
)

// locateResume finds the file of the stored position r when the open
// file, at the path, is not it: the held file (*held, which it takes when
// it is r's), by its inode, renamed within the directory, or else a copy
// of it that holds r's offset (one that holds nothing after it too: read to
// its end, the follower goes on with the file at the path without a loss
// to report). It returns nil when the open file is the position's, or none
// is found.
func (fl *Follower) locateResume(r Position, held **os.File) (*os.File, found, error) {
	fi, err := fl.f.Stat()
	if err != nil {
		return nil, 0, nil // the first read says why
	}
	if streamfile.Inode(fi) == r.File.Ino {
		var b [streamfile.HeaderSize]byte
		n, err := fl.f.ReadAt(b[:], 0)
		if n == len(b) {
			if h, err := streamfile.ParseHeader(b[:]); err == nil && fi.Size() >= r.Offset {
				if id, err := streamfile.IdentityOf(fi, h); err == nil && id == r.File {
					return nil, 0, nil // the position's file
				}
			}
		} else if !errors.Is(err, io.EOF) {
			return nil, 0, nil // cannot tell
		}
		// Truncated, and maybe written anew, in place: under a new
		// header, or its own (shorter than the position), or none a
		// reader takes (an older writer's zeros where it was).
	} else {
		// The held file, but for one with nothing after the position:
		// a copy of it at the path (LocateCopy) is read on from there
		// rather, when there is one.
		if f := *held; f != nil && heldSize(f, r) > r.Offset {
			*held = nil
			return f, foundHeld, nil
		}
		if f, err := streamfile.Locate(fl.path, r.File); err != nil || f != nil {
			return f, foundRenamed, err
		}
	}
	f, err := streamfile.LocateCopy(fl.path, r.File, r.Offset)
	if f == nil {
		// Without a copy, the held file with nothing after the position
		// yet is read on all the same: a writer that kept it open may
		// still append to it, and nothing of it was lost.
		if h := *held; h != nil && heldSize(h, r) == r.Offset {
			*held = nil
			return h, foundHeld, nil
		}
		return nil, 0, err
	}
	return f, foundCopy, err
}

// drainInstead closes the open file and reads f, found in the directory
// of the path, in its place, as a file rotated away from the path
// (drainRotated). It returns f's stat information; false, with f closed,
// when f cannot be looked at.
func (fl *Follower) drainInstead(f *os.File) (os.FileInfo, bool) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false
	}
	if err := fl.f.Close(); err != nil {
		fl.log.Warn("closing the stream file left for one in the directory failed", "err", err)
	}
	fl.f = fl.timed(f)
	fl.drainRotated(fi)
	return fi, true
}

// drainRotated marks the open file, fi, as one a rotation renamed away
// from the path: it is left once read to its end and quiet for the grace,
// counted from when it was last written, so that a file rotated long ago
// is not waited on for the whole grace.
func (fl *Follower) drainRotated(fi os.FileInfo) {
	r := &fl.replace
	r.draining, r.drainSize, r.grew, r.drained = true, fi.Size(), fi.ModTime(), 0
	if now := time.Now(); r.grew.After(now) { // the file server's clock ahead of ours
		r.grew = now
	}
}

// check looks at the open file and at the path after a wake-up.
func (fl *Follower) check(polled bool) error {
	fi, err := fl.f.Stat()
	if err != nil {
		return fl.fail(fmt.Errorf("tail: %w", err))
	}
	size := fi.Size()
	if polled && size > max(fl.lastSize, fl.pos()) {
		fl.obs.Event(EventPollRead)
		fl.log.Debug("poll found new data", "size", size)
	}
	seen := fl.lastSize
	fl.lastSize = size
	inPlace := fl.checkInPlace(size, seen, fl.pos())
	fl.looked = fl.reads // the next read sees the file as just looked at
	if inPlace {
		return nil
	}
	r := &fl.replace
	lookedAt := time.Now()
	st, err := os.Stat(fl.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if r.leftAt.IsZero() {
			r.leftAt = time.Now()
		}
		r.draining, r.told, r.unopened = false, false, nil
		if r.openTrouble.Failing() {
			fl.passed(&r.openTrouble, "the file that could not be opened is gone from the path")
		}
		if !r.removed {
			r.removed = true
			r.missing.Reset(time.Now())
			if cur, err := fl.f.Stat(); err == nil && linked(cur) { // looked at after the path: fi may predate the removal
				// Renamed, as a rotation does before it creates the
				// next file: routine, not a loss.
				fl.log.Info("stream file renamed away from the path; reading it on, and waiting for a file at the path", "offset", fl.pos())
			} else {
				fl.log.Warn("stream file removed; waiting for it to come back", "offset", fl.pos())
			}
			fl.obs.Event(EventRemoved)
		} else if ok, _ := r.missing.Allow(time.Now()); ok {
			fl.log.Warn("stream file still missing", "offset", fl.pos())
		}
	case err != nil:
		if ok, _ := r.missing.Allow(time.Now()); ok {
			fl.log.Warn("cannot look at the path", "err", err)
		}
	case !os.SameFile(fi, st):
		// Another file at the path, also after none for a while (a
		// rotation's rename, then its create): the open file is left once
		// read to its end and quiet for the grace, counted from when the
		// path was first seen without it, so that a producer that kept
		// its descriptor may write a little longer, and rotations closer
		// together than the grace do not keep it open.
		noticed := r.leftAt.IsZero()
		if noticed {
			r.leftAt = time.Now()
		}
		if !r.draining {
			r.draining, r.drainSize, r.grew, r.drained = true, fi.Size(), r.leftAt, 0
			if noticed && polled && !r.namedAt.IsZero() && isSymlink(fl.path) {
				// Found by a poll, no notification for it (a symlink in
				// the middle of a chain, which is not watched): the
				// switch came after the last look that found the path
				// naming the open file, and the file has been quiet
				// since then, or since its last write: that counts
				// towards the grace, which would otherwise add to the
				// poll's delay. Not for a plain path found by a poll
				// (notifications unavailable): a rotation renames the
				// file away at some time after that look, perhaps just
				// before the poll, and its producer may write to it for
				// the grace after that.
				r.grew = r.namedAt
				if m := fi.ModTime(); m.After(r.grew) {
					r.grew = m
				}
				if r.grew.After(r.leftAt) { // the file server's clock ahead of ours
					r.grew = r.leftAt
				}
			}
		}
		r.removed = false
		fl.see(st)
	case r.draining:
		// The path names the open file again (a symlink turned back, a
		// rename undone) before the follower left it: it stays.
		r.draining, r.leftAt = false, time.Time{}
		fl.forgetSeen()
		fl.log.Info("the path names the stream file being read again; reading on in it", "offset", fl.pos())
	case r.removed:
		r.removed, r.leftAt = false, time.Time{}
		fl.log.Info("stream file is back")
	}
	if err == nil && os.SameFile(fi, st) {
		r.namedAt = lookedAt
	}
	return nil
}

// Look looks at the path while the follower is busy (its caller holds the
// records read, waiting for them to be taken): a file that took the path
// is kept open for openNext (see), as check does when the follower waits,
// so that a path retargeted more than once while a subscription lags does
// not skip a file. Call it from the goroutine that calls Next, between
// calls.
func (fl *Follower) Look() {
	if fl.err != nil {
		return
	}
	st, err := os.Stat(fl.path)
	if err != nil {
		return
	}
	if cur, err := fl.f.Stat(); err == nil && !os.SameFile(cur, st) {
		fl.see(st)
	}
}

// Wakeups returns the channel of the notifications for the path (nil
// before the follower first waited, or while it polls only), for a caller
// that looks (Look) at each one while the follower is busy; it then gives
// the follower the last it took back (Rewake), so that Next does not wait
// for the next poll to see what it told. Call both from the goroutine that
// calls Next, between calls.
func (fl *Follower) Wakeups() <-chan struct{} {
	if fl.watch == nil {
		return nil
	}
	return fl.watch.wake
}

// Rewake gives back a notification taken from Wakeups.
func (fl *Follower) Rewake() {
	if fl.watch != nil {
		fl.watch.notify()
	}
}

// see keeps the file at the path, of stat information st, open for
// openNext, when it is not the last one seen already (replaceState.seen).
// One that cannot be opened is not kept: switchFile says why when it comes
// to it.
func (fl *Follower) see(st os.FileInfo) {
	r := &fl.replace
	if n := len(r.seen); n > 0 && os.SameFile(r.seen[n-1].fi, st) {
		return
	}
	if len(r.seen) >= maxSeen { // HeldAfter may have given more
		if r.seenFull {
			return
		}
		r.seenFull = true
		fl.log.Warn("the path named more files than a follower keeps while it reads the one before them to its end; the next ones are not read, only the one at the path once it gets there",
			"kept", maxSeen, "offset", fl.pos())
		return
	}
	name, err := filepath.EvalSymlinks(fl.path)
	if err != nil {
		name = fl.path
	}
	f, err := fl.open(fl.path)
	if err != nil {
		return
	}
	if fi, err := f.Stat(); err != nil || !os.SameFile(fi, st) {
		f.Close() // replaced again meanwhile: the next check sees it
		return
	}
	r.seen = append(r.seen, seenFile{f: f, fi: st, name: name})
	fl.log.Debug("another file at the path: it is read after the open one", "file", name, "seen", len(r.seen))
}

// forgetSeen closes the files seen at the path and forgets them.
func (fl *Follower) forgetSeen() {
	r := &fl.replace
	for _, s := range r.seen {
		s.f.Close()
	}
	r.seen, r.seenFull = nil, false
}

// linked reports whether the open file, of stat information fi, still has
// a name: it was renamed, not removed.
func linked(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink > 0
}

// changedInPlace looks, before damage is reported or after a read
// (afterRead), whether the file was truncated or rewritten under the
// follower; if so it starts over in it. at is where the frame the caller
// drops starts: the read position, for a copy of the file. After a read, a
// file shorter than the read position is left to the next look: it was
// truncated after the read, and what was read is the old file's, handed
// out first.
func (fl *Follower) changedInPlace(at int64, afterRead bool) bool {
	if fl.opts.Replay {
		return false
	}
	fi, err := fl.f.Stat()
	if err != nil || afterRead && fi.Size() < fl.pos() {
		return false
	}
	return fl.checkInPlace(fi.Size(), fl.lastSize, at)
}

// checkInPlace starts over in the open file when it shrank below the read
// position at or its header changed. seen is the largest size the
// follower saw the file have. What it had not read of it is read from a
// copy in the directory when there is one (readRestFromCopy); otherwise it
// is gone, and logged as an error (logrotate's copytruncate moved it to a
// copy streamd did not find), also when the file grew past the read
// position again before the follower looked.
func (fl *Follower) checkInPlace(size, seen, at int64) bool {
	if fl.hdr.BeaconInterval == 0 {
		return false
	}
	var b [streamfile.HeaderSize]byte
	n, err := fl.f.ReadAt(b[:], 0)
	sameHeader := n == len(b) && b == fl.rawHdr
	what, unread := "stream file was rewritten with a new header; reading it from the beginning", seen-at
	switch {
	case size < at:
		if sameHeader && fl.cutAtDamage(size, at) {
			return true
		}
		what = "stream file was truncated below the read position; reading it from the beginning"
	case sameHeader:
		return size != seen && fl.cutRewritten(at) && fl.cutAtDamage(size, at)
	case n < len(b) && err != nil && !errors.Is(err, io.EOF):
		return false // cannot tell: an I/O error is no new header
	}
	fl.report()
	if fl.readRestFromCopy(at, seen) {
		return true
	}
	attrs := []any{"offset", at, "size", size, "file_name", fl.id.FileName, "created_at_ms", fl.id.CreatedAtMs}
	if unread > 0 {
		fl.log.Error("stream file was truncated before its records were all read: those not read are lost to this reader "+
			"(copytruncate leaves them only in the copy, which was not found in the directory of the path; rotate by renaming the file instead); reading it from the beginning",
			append(attrs, "unread_bytes_at_least", unread)...)
		fl.obs.Event(EventLost)
	} else {
		fl.log.Warn(what, attrs...)
	}
	fl.obs.Event(EventTruncated)
	fl.startOver()
	return true
}

// cutAtDamage goes on where `streamd repair` cuts the open file for the
// damage this follower skipped in it (damageState.cutAt), when the file,
// under the header the caller found unchanged, shrunk below the read
// position at (or was cut and grew back: cutRewritten) and still reaches
// there at size: repair cut it there (with --force, also the frames after
// the damage the follower read), and writers append there. What it read
// before is still in the file, as it was: reading it again from the
// beginning would deliver it all again. It reports whether it did.
func (fl *Follower) cutAtDamage(size, at int64) bool {
	cut := fl.damage.cutAt
	if cut < 0 || size < cut || cut > at {
		return false
	}
	fl.report()
	fl.log.Warn("stream file was cut at the damaged bytes this reader skipped, below the read position (as streamd repair does): reading on there, where writers append; what it read after them was delivered before the cut",
		"cut_offset", cut, "offset", at, "size", size)
	fl.obs.Event(EventTruncated)
	fl.damage.forget()
	fl.dec, fl.reportPos, fl.damage.goodEnd = streamfile.NewDecoder(fl.f, fl.hdr, cut), cut, cut
	return true
}

// cutRewritten reports whether a good frame is now where the damage this
// follower skipped began (damageState.cutAt), below the read position at:
// the file was cut there (streamd repair) and writers appended to it past
// the read position before the follower looked, so that it never saw it
// shrink. Damage does not mend itself; and a file cut lower than that
// puts no frame boundary there but by chance. Looked at only when the
// file's size changed: a frame is read.
func (fl *Follower) cutRewritten(at int64) bool {
	cut := fl.damage.cutAt
	if cut < 0 || cut >= at { // at the damage: rewrittenAt looks
		return false
	}
	_, err := streamfile.NewDecoder(fl.f, fl.hdr, cut).Next()
	return err == nil
}

// readRestFromCopy goes on, when the open file was truncated or written
// anew in place, in a copy of it in the directory that holds more than was
// read of it (logrotate's copytruncate makes one just before it
// truncates): from the read position at to the copy's end, then, as after
// a rotation, in the file at the path from its beginning. It reports
// whether it found one. What the file held past the copy's end, up to
// seen, the largest size the follower saw it have, is lost: logged at
// ERROR and counted.
func (fl *Follower) readRestFromCopy(at, seen int64) bool {
	if fl.dec == nil || fl.opts.Replay {
		return false
	}
	f, err := streamfile.LocateCopy(fl.path, fl.id, at+1)
	if err != nil {
		fl.log.Warn("cannot look for a copy of the truncated stream file in the directory of the path", "err", err)
		return false
	}
	if f == nil {
		return false
	}
	fi, ok := fl.drainInstead(f)
	if !ok {
		return false
	}
	fl.log.Info("stream file truncated in place after a copy of it was made (copytruncate): reading the copy on from the read position, then the file at the path from its beginning",
		"copy_path", f.Name(), "offset", at, "copy_size", fi.Size())
	if lost := seen - fi.Size(); lost > 0 {
		fl.log.Error("the copy of the truncated stream file is shorter than the file was: what the file held after the copy's end is lost to this reader",
			"copy_path", f.Name(), "copy_size", fi.Size(), "size_seen", seen, "unread_bytes_at_least", lost)
		fl.obs.Event(EventTruncated)
		fl.obs.Event(EventLost)
	}
	fl.id.Ino = streamfile.Inode(fi)
	fl.rec.File = fl.id
	fl.dec = streamfile.NewDecoder(fl.f, fl.hdr, at)
	fl.lastSize = fi.Size()
	fl.damage.forget()
	return true
}

// grewUnderLock looks at the size of the file being left under a shared
// flock, and reports whether it grew since it last looked. A writer that
// found the path unchanged under its exclusive lock (streamfile's
// RefuseReplaced, as the daemon's copies are written) has finished its
// batch once the shared lock is granted, and any later one finds the
// replacement and writes to the new file: reading the old one up to that
// size loses none of its copies. The lock is not held while reading, so no
// writer waits on a subscription's handler. The error is ctx's.
func (fl *Follower) grewUnderLock(ctx context.Context) (bool, error) {
	var fi os.FileInfo
	var statErr error
	ok, err := fl.underSharedLock(ctx, func() { fi, statErr = fl.f.Stat() })
	if !ok || statErr != nil || fi.Size() <= fl.replace.drainSize {
		return false, err
	}
	fl.replace.drainSize = fi.Size()
	return true, nil
}

// lockPoll bounds the wait between two tries of a shared flock.
const lockPoll = 50 * time.Millisecond

// underSharedLock runs fn, when not nil, under a shared flock on the open
// file: once no writer holds its exclusive lock, so not in the middle of
// an append. While a writer holds it, it tries again, the wait counted as
// a stall (Stalled: a writer stuck on a hung disk must reach the
// watchdog), until ctx ends, whose error it returns. It reports false,
// without running fn, when the file cannot be locked.
func (fl *Follower) underSharedLock(ctx context.Context, fn func()) (ok bool, err error) {
	var inner any = fl.f
	if t, isTimed := fl.f.(timedFile); isTimed {
		inner = t.file
	}
	f, canLock := inner.(interface{ Fd() uintptr })
	if !canLock {
		return false, nil
	}
	stalled := false
	defer func() {
		if stalled {
			fl.reading.Store(0)
		}
	}()
	for wait := time.Millisecond; ; wait = min(2*wait, lockPoll) {
		locked, err := durable.TryLock(f.Fd(), durable.Shared)
		if err != nil {
			return false, nil
		}
		if locked {
			break
		}
		if !stalled {
			stalled = true
			fl.reading.Store(time.Now().UnixNano())
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(wait):
		}
	}
	if fn != nil {
		fn()
	}
	durable.Unlock(f.Fd())
	return true, nil
}

// switchFile opens the file that now has the path, after the old one was
// read to its end, where the decoder said err.
//
// A file that cannot be opened (its mode or owner shuts the daemon out) or
// that is not a regular file (a directory, a FIFO) is no reason to stop:
// the replacement is counted once, the error logged at once and then at
// most every 10 s, and the follower keeps its position at the end of the
// old file and tries again at each wake-up, until the file can be opened
// or is replaced or removed again.
func (fl *Follower) switchFile(err error) error {
	r := &fl.replace
	nf, name, rotated, oerr := fl.openNext()
	if errors.Is(oerr, fs.ErrNotExist) {
		r.draining = false
		return nil // check notices the removal at the next wake-up
	}
	var st, old os.FileInfo // the new file's and the open one's, nil when unknown
	if oerr == nil {
		st, _ = nf.Stat()
		old, _ = fl.f.Stat()
		if st != nil && old != nil && os.SameFile(old, st) {
			// The path names the open file again: nothing to switch to.
			nf.Close()
			r.draining, r.leftAt = false, time.Time{}
			return nil
		}
	}
	if oerr != nil {
		r.draining = false // check sets it again at the next wake-up
		st, _ := os.Stat(fl.path)
		fl.countReplacement(st)
		oerr = fmt.Errorf("tail: %w", oerr)
		r.openTrouble.Failed(fl.log, "stream file replaced by a file that cannot be opened; its records wait, and it is tried again at each notification and poll",
			oerr, "old_offset", fl.pos())
		fl.troubled(oerr)
		return nil
	}
	fl.report()
	if errors.Is(err, streamfile.ErrTruncated) {
		fl.log.Warn("replaced file ends inside a frame; that frame is lost", "offset", fl.pos(), "size", fl.size())
		if !fl.torn.told { // else counted when it was said
			fl.obs.Event(EventTornTail)
		}
	}
	if r.openTrouble.Failing() {
		fl.passed(&r.openTrouble, "the file that replaced the stream file can be opened now")
	}
	// Routine (a rotation): the old file was read to its end, and what
	// was lost at its end (a torn frame) has its own WARN.
	msg := "stream file replaced; reading the file now at the path from its beginning (a stream file read before, from where it was left)"
	if rotated {
		msg = "stream file replaced; reading the file after it, rotated away from the path already, from its beginning (a stream file read before, from where it was left), then the file at the path"
	}
	fl.log.Info(msg, "old_ino", fl.id.Ino, "old_file_name", fl.id.FileName, "old_created_at_ms", fl.id.CreatedAtMs, "old_offset", fl.pos(),
		"old_records_after_switch", r.drained, "rotation_grace", fl.opts.RotationGrace, "file", name)
	fl.countReplacement(st)
	r.told, r.unopened = false, nil
	if old != nil && fl.last.end > 0 { // a stream file, of which a record was read
		off := fl.pos()
		if fl.dec == nil { // passing over damage: on after the last record, to meet it again
			off = fl.last.end
		}
		r.leave(leftFile{id: fl.id, fi: old, offset: off, last: fl.last})
	}
	cerr := fl.f.Close()
	fl.f = nf
	fl.startOver()
	r.draining, r.removed, r.leftAt, r.namedAt = false, false, time.Time{}, time.Time{}
	if rotated && st != nil {
		fl.drainRotated(st)
	}
	if cerr != nil {
		fl.log.Warn("closing the replaced file failed", "err", cerr)
	}
	return nil
}

// countReplacement tells EventReplaced for st, the file at the path, unless
// it was told for it already while it could not be opened. A file that
// cannot be looked at (st is nil) is taken for the one told.
func (fl *Follower) countReplacement(st os.FileInfo) {
	r := &fl.replace
	if r.told && (st == nil || r.unopened == nil || os.SameFile(r.unopened, st)) {
		return
	}
	fl.obs.Event(EventReplaced)
	r.told, r.unopened = true, st
}

// openNext opens the file switchFile goes on with, and returns its name,
// and whether it is rotated away from the path already: the next file
// rotated after the ones read within the directory (rotations closer
// together than the follower's lag leave several), else the first file
// seen at the path since (replaceState.seen), or else the file at the path.
func (fl *Follower) openNext() (f file, name string, rotated bool, err error) {
	r := &fl.replace
	r.readUpTo = max(r.readUpTo, fl.id.CreatedAtMs)
	rf, err := streamfile.NextRotated(fl.path, fl.id.FileName, r.readUpTo)
	if err != nil {
		r.nextTrouble.Failed(fl.log, "cannot look for the stream file rotated after the one read; the file at the path is read next", err)
	} else if r.nextTrouble.Failing() {
		r.nextTrouble.Passed(fl.log, "the files rotated after the one read can be looked for again")
	}
	if rf != nil {
		if fi, err := rf.Stat(); err == nil {
			r.seen = slices.DeleteFunc(r.seen, func(s seenFile) bool {
				if os.SameFile(s.fi, fi) {
					s.f.Close()
					return true
				}
				return false
			})
		}
		return fl.timed(rf), rf.Name(), true, nil
	}
	if len(r.seen) > 0 {
		s := r.seen[0]
		r.seen, r.seenFull = slices.Delete(r.seen, 0, 1), false
		if st, err := os.Stat(fl.path); err == nil && os.SameFile(st, s.fi) {
			return s.f, fl.path, false, nil
		}
		return s.f, s.name, true, nil
	}
	nf, err := fl.open(fl.path)
	return nf, fl.path, false, err
}

// isSymlink reports whether path is a symlink.
func isSymlink(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSymlink != 0
}
