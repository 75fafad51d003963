package streamfile

import (
	"errors"
	"fmt"
)

// Repair makes the stream file at path appendable when writers refuse it
// with a [*DamageError]: it reads the whole file under the file's lock, and
// when its readable records stop before its end it calls discard with the
// damage, then truncates the file at the damage's offset, discarding what
// follows (an end-of-stream frame in the middle and every frame after it, or
// the bytes after the last good frame), and syncs it. It returns the damage
// it repaired, nil when there was none, and where the next append writes:
// the damage's offset, or, without damage, the file's size or the start of
// what the next append removes or overwrites itself (a torn last frame,
// zeros to the end after it, a closing end-of-stream frame).
func Repair(path string, discard func(*DamageError)) (*DamageError, int64, error) {
	w, err := OpenWriter(path, CreateOptions{})
	if err != nil {
		return nil, 0, err
	}
	var de *DamageError
	var next int64
	err = w.locked(func() error {
		size, err := w.size()
		if err != nil {
			return err
		}
		se, err := w.scan(HeaderSize, size, nil)
		next = se.next
		if !errors.As(err, &de) {
			return err
		}
		discard(de)
		next = de.Offset
		if err := w.f.Truncate(de.Offset); err != nil {
			return fmt.Errorf("streamfile: truncate %s at %d: %w", path, de.Offset, err)
		}
		return w.Sync()
	})
	return de, next, errors.Join(err, w.Close())
}
