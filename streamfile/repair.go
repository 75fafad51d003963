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
// it repaired, nil when the file's records reach its end. A torn last frame
// or zeros to the end (after the first bytes of a torn frame too) are no
// damage: the next append repairs those itself.
func Repair(path string, discard func(*DamageError)) (*DamageError, error) {
	w, err := OpenWriter(path, CreateOptions{})
	if err != nil {
		return nil, err
	}
	var de *DamageError
	err = w.locked(func() error {
		size, err := w.size()
		if err != nil {
			return err
		}
		_, err = w.scan(HeaderSize, size, nil)
		if !errors.As(err, &de) {
			return err
		}
		discard(de)
		if err := w.f.Truncate(de.Offset); err != nil {
			return fmt.Errorf("streamfile: truncate %s at %d: %w", path, de.Offset, err)
		}
		return w.Sync()
	})
	return de, errors.Join(err, w.Close())
}
