package tail

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/streamfile"
)

// This file holds what a follower does at damaged bytes: a frame whose
// checksum does not match, bytes that are not a frame. See "Following" in
// the package documentation.

// CorruptPolicy says what a [Follower] does at a frame whose checksum does
// not match, or at bytes that are not a frame.
type CorruptPolicy uint8

const (
	// SkipCorrupt counts and logs the damage and reads on: after the frame
	// when its framing is intact, otherwise from the first whole frame
	// before the next beacon, or else the first frame after that beacon.
	SkipCorrupt CorruptPolicy = iota
	// StopOnCorrupt makes [Follower.Next] return the error, now and on
	// every later call.
	StopOnCorrupt
)

// damageState is what a follower knows of damage in the open file.
type damageState struct {
	skipAt    int64           // >= 0: find the first frame boundary after this offset (after a format error)
	skipFrom  int64           // where that search starts: skipAt, or the damage in a beacon the frame at skipAt spans
	recheckAt int64           // the frame read again after damage met there (see readAgain), or -1
	logLimit  ratelog.Limiter // of the log lines about corrupt frames, across files
	// leftOutAt, leftOutIno and leftOutErr: the last corrupt frame the
	// log limit left out of the log (logLeftOut), across files: its
	// offset, its file's inode, the error.
	leftOutAt  int64
	leftOutIno uint64
	leftOutErr error
	// replayRecheckAt is where a replay last found the data ending inside
	// a frame, and read it again once writers let go of the file (idle);
	// -1 after a record was read since.
	replayRecheckAt int64
	// leftoversAt and leftoversSize: a crash's leftovers were found from
	// that offset to the end of a file of that size (atLeftovers), which
	// each wake-up meets again until a writer removes them; -1 if none.
	leftoversAt, leftoversSize int64
	// truncatedAt and truncatedSize: the read position and file size
	// when the data last ended inside a frame (pastDamagedSize), -1 when
	// not, and since when; sizeChecked: the frame there was checked for
	// whole frames after it.
	truncatedAt, truncatedSize int64
	truncatedSince             time.Time
	sizeChecked                bool
	// skipScannedSize: the file size when skipDamaged last found no
	// frame to read on at, -1 when not.
	skipScannedSize int64
	// skipSizeDamaged: the damage at skipAt is a frame that runs past the
	// end (pastDamagedSize), which reads as a torn frame.
	skipSizeDamaged bool
	// goodEnd is the end of the last good frame read in the open file
	// (where reading started, before the first). cutAt, -1 if none, is
	// where `streamd repair` would cut the file for the damage this
	// follower skipped (cutAtDamage), as Writer.scan finds it: the end of
	// the last good frame before the first damage that writers do not
	// step over. cutChecksum: the damage since cutAt is frames whose
	// checksum does not match, which they step over once a good frame
	// follows.
	goodEnd, cutAt int64
	cutChecksum    bool
}

// noDamage returns the state of a file where no damage was met.
func noDamage() damageState {
	return damageState{skipAt: -1, skipFrom: -1, recheckAt: -1, replayRecheckAt: -1, leftoversAt: -1, leftoversSize: -1, truncatedAt: -1, truncatedSize: -1, skipScannedSize: -1, goodEnd: -1, cutAt: -1}
}

// forget drops what is known of damage in the open file, which is read
// again from its header. The log limit carries over.
func (d *damageState) forget() {
	limit, at, ino, err := d.logLimit, d.leftOutAt, d.leftOutIno, d.leftOutErr
	*d = noDamage()
	d.logLimit, d.leftOutAt, d.leftOutIno, d.leftOutErr = limit, at, ino, err
}

// readAgain reports whether the damage met at the frame at off is met there
// for the first time; if so the frame is read again from the file with a
// fresh decoder. Damage counts only when it is seen twice: a writer that
// repairs a torn tail truncates it and writes anew, and a read that
// straddled the repair sees old and new bytes together.
func (fl *Follower) readAgain(off int64) bool {
	if fl.damage.recheckAt == off {
		return false
	}
	fl.damage.recheckAt = off
	fl.dec = streamfile.NewDecoder(fl.f, fl.hdr, off)
	return true
}

// atLeftovers reports whether the damage met at the frame at off is what a
// crash leaves after the last frame (streamfile.CrashLeftovers: zeros, or a
// torn frame ending in zeros), and if so puts the decoder back at off. The
// next writer removes such bytes and appends at off, so a live follower
// waits there as at a torn frame: read as corrupt frames, they would take
// it past off, and the repair would then cut the file below its position
// (read again from the beginning) or put a frame's middle there (skipped).
// A replay reads them as damage: it ends at the end of the file.
func (fl *Follower) atLeftovers(off int64) bool {
	if fl.opts.Replay {
		return false
	}
	size := fl.size()
	if size <= off {
		return false
	}
	d := &fl.damage
	if off != d.leftoversAt || size != d.leftoversSize { // not read already, as they are
		ok, err := streamfile.CrashLeftovers(fl.f, int64(fl.hdr.BeaconInterval), off, size)
		if err != nil || !ok {
			return false
		}
		d.leftoversAt, d.leftoversSize = off, size
	}
	fl.dec = streamfile.NewDecoder(fl.f, fl.hdr, off)
	return true
}

// pastDamagedSize handles a frame at the read position that runs past the
// end of the file although whole frames follow it, reading on cleanly to
// the end (streamfile.DamagedSize): not a frame a writer is still writing,
// as writers append in order, but a damaged size field, which would hold
// the follower there for good. It reports the damage by the policy and has
// the follower skip it as bytes that are not a frame, returning true. A
// live follower checks only a file that has not grown there for
// RotationGrace (the upstream writer, which takes no lock, can leave a
// frame half written while it buffers), once, and while no writer holds
// the file's lock; a replay checks at once. What cannot be checked (a
// read error) is taken for a torn frame, and checked again after another
// grace.
func (fl *Follower) pastDamagedSize(ctx context.Context) (bool, error) {
	off, size := fl.pos(), fl.size()
	d := &fl.damage
	if off != d.truncatedAt || size != d.truncatedSize {
		d.truncatedAt, d.truncatedSize, d.truncatedSince, d.sizeChecked = off, size, time.Now(), false
	}
	if d.sizeChecked || size < 0 || !fl.opts.Replay && time.Since(d.truncatedSince) < fl.opts.RotationGrace {
		return false, nil
	}
	d.sizeChecked = true
	var err error
	if _, lerr := fl.underSharedLock(ctx, func() {
		// The size first: when the frame still runs past it, no whole
		// frame a writer appended after the frame can lie before it.
		size := fl.size()
		if _, err := streamfile.NewDecoder(fl.f, fl.hdr, off).Next(); !errors.Is(err, streamfile.ErrTruncated) {
			return // written since: read it again
		}
		_, err = streamfile.DamagedSize(fl.f, int64(fl.hdr.BeaconInterval), off, size)
	}); lerr != nil {
		return false, lerr
	}
	if _, damaged := errors.AsType[*streamfile.FormatError](err); !damaged {
		if err != nil {
			fl.log.Debug("cannot check the frame the file ends in for damage; taking it for a torn frame", "offset", off, "err", err)
			d.sizeChecked, d.truncatedSince = false, time.Now()
		}
		return false, nil
	}
	if err := fl.damaged(EventFormat, err, off); err != nil {
		return false, err
	}
	d.skipAt, d.skipFrom, d.skipSizeDamaged, fl.dec = off, off, true, nil
	return true, nil
}

// damaged handles a corrupt frame by the policy.
func (fl *Follower) damaged(e Event, err error, off int64) error {
	fl.obs.Event(e)
	if fl.opts.OnCorrupt == StopOnCorrupt {
		next := fl.nextFrame(err, off)
		fl.log.Error("corrupt frame; stopping", "offset", off, "err", err, "next_frame", next)
		if next < 0 {
			return fl.fail(fmt.Errorf("tail: %s: %w", fl.path, err))
		}
		return fl.fail(fmt.Errorf("tail: %s: %w (a reader that skips it reads on at offset %d)", fl.path, err, next))
	}
	if d := &fl.damage; d.cutAt < 0 {
		d.cutAt, d.cutChecksum = d.goodEnd, e == EventChecksum
	} else if e != EventChecksum {
		d.cutChecksum = false
	}
	if ok, suppressed := fl.damage.logLimit.Allow(time.Now()); ok {
		fl.log.Warn("corrupt frame; skipping it", "offset", off, "err", err, "suppressed", suppressed)
	} else {
		fl.damage.leftOutAt, fl.damage.leftOutIno, fl.damage.leftOutErr = off, fl.id.Ino, err
	}
	return nil
}

// nextFrame returns where a follower that skipped the damage err met at off
// would read on: after a frame whose checksum does not match, or at the
// first frame after bytes that are not one (streamfile.SkipDamage); -1 when
// the file does not hold it yet.
func (fl *Follower) nextFrame(err error, off int64) int64 {
	if ce, ok := errors.AsType[*streamfile.ChecksumError](err); ok {
		return ce.End
	}
	p, err := streamfile.SkipDamage(fl.f, fl.hdr, off, fl.size())
	if err != nil {
		return -1
	}
	return p
}

// logLeftOut logs the corrupt frames the log limit left out, once
// ratelog.Every passed since the last line: without it, damage met within
// that time would reach the log only with the next damage, maybe never.
func (fl *Follower) logLeftOut() {
	fl.sayLeftOut(fl.damage.logLimit.Overdue(time.Now()))
}

// sayLeftOut logs n corrupt frames the log limit left out, if any: when
// overdue (logLeftOut), and at Close, whatever the time.
func (fl *Follower) sayLeftOut(n int) {
	if d := &fl.damage; n > 0 {
		fl.log.Warn("corrupt frames skipped since the last line, left out of the log", "count", n,
			"last_offset", d.leftOutAt, "last_ino", d.leftOutIno, "last_err", d.leftOutErr)
	}
}

// skipDamaged finds the first frame after the damaged bytes at
// damage.skipAt and puts the decoder there (streamfile.SkipDamage): the
// first whole frame before the next beacon, else the frame boundary a
// beacon gives. When a frame reads at skipAt again, the damaged bytes were
// cut and written anew (streamd repair, then an append): it reads on
// there. It reports false when it has to wait for more data.
func (fl *Follower) skipDamaged() (bool, error) {
	skipAt := fl.damage.skipAt
	if done, rewritten := fl.rewrittenAt(skipAt); rewritten {
		return done, nil
	}
	size := fl.size()
	if size == fl.damage.skipScannedSize {
		return false, nil // nothing new to find before the file changes
	}
	p, err := streamfile.SkipDamage(fl.f, fl.hdr, fl.damage.skipFrom, size)
	if err != nil {
		return false, &readError{fmt.Errorf("tail: %s: %w", fl.path, err)}
	}
	if p < 0 {
		fl.damage.skipScannedSize = size
		return false, nil
	}
	// Looked at again after the search: a writer that cut the damage and
	// appended while it read, which it may have read the new frames of,
	// has then put a frame at skipAt.
	if done, rewritten := fl.rewrittenAt(skipAt); rewritten {
		return done, nil
	}
	fl.log.Warn("skipped damaged bytes", "offset", skipAt, "next_frame", p)
	return fl.resumeAt(p), nil
}

// rewrittenAt reports whether the damaged bytes at skipAt were cut and
// written anew: a frame reads there (done: the decoder is put there), or
// starts there and is still being written (not done: wait for it). A
// frame that runs past the end was the damage itself (skipSizeDamaged).
func (fl *Follower) rewrittenAt(skipAt int64) (done, rewritten bool) {
	switch _, err := streamfile.NewDecoder(fl.f, fl.hdr, skipAt).Next(); {
	case err == nil:
		fl.log.Info("the damaged bytes were replaced by a frame; reading on there", "offset", skipAt)
		return fl.resumeAt(skipAt), true
	case errors.Is(err, streamfile.ErrTruncated) && !fl.damage.skipSizeDamaged:
		return false, true
	}
	return false, false
}

// resumeAt puts the decoder at the frame at p after damaged bytes, which
// count as read, and reports true.
func (fl *Follower) resumeAt(p int64) bool {
	fl.dec = streamfile.NewDecoder(fl.f, fl.hdr, p)
	fl.reportPos += p - fl.damage.skipAt
	fl.damage.skipAt, fl.damage.skipSizeDamaged = -1, false
	return true
}
