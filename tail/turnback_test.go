package tail

import (
	"path/filepath"
	"testing"
	"time"
)

// TestSymlinkTurnedBack: a symlink retargeted to another file and turned
// back before the rotation grace ended leaves the follower in the file it
// reads: no replacement, and no record of it read twice.
func TestSymlinkTurnedBack(t *testing.T) {
	dir := t.TempDir()
	a, b, link := filepath.Join(dir, "a.ss"), filepath.Join(dir, "b.ss"), filepath.Join(dir, "cur.ss")
	fa := frames("a", 1, 10, 1, 40)
	writeFile(t, a, oldHeader, fa[:5])
	writeFile(t, b, newHeader, frames("b", 1, 3, 1, 40))
	retarget := func(to string) { relink(t, link, to) }
	retarget(a)
	const grace = 100 * time.Millisecond
	var fl *Follower
	read, step, back := 0, 0, time.Time{}
	onWait := func() { // on Next's goroutine: fl's state can be read
		switch {
		case read < 5:
		case step == 0:
			retarget(b)
			step++
		case step == 1 && fl.replace.draining: // the follower saw b
			retarget(a)
			back = time.Now()
			step++
		case step == 2 && time.Since(back) > 3*grace:
			appendFrames(t, a, fa[5:])
			step++
		}
	}
	obs := newObserver()
	var err error
	fl, err = New(Options{Path: link, PollInterval: 20 * time.Millisecond, RotationGrace: grace, Observer: obs, Logger: testLogger(t), OnWait: onWait})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if err := sameFrames(nextN(t, fl, 10, &read), fa); err != nil {
		t.Error(err)
	}
	if n := obs.count(EventReplaced); n != 0 {
		t.Errorf("%d replacements, want none", n)
	}
}
