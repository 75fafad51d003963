package tail

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watcher delivers the file notifications of directories to the followers
// that share it ([Options.Watcher]): one inotify instance, one watch per
// directory, and the goroutines of one fsnotify watcher and of its
// dispatch, however many files are followed. A follower without one takes
// an instance of its own (Linux allows 128 per user by default:
// fs.inotify.max_user_instances), and with it the notifications of every
// file of its directory. A directory reached by two paths (a symlink to
// it), which one inotify instance names by the first only, is watched by
// a Watcher of the follower's own for the second. Close it once its
// followers are closed.
type Watcher struct {
	log     *slog.Logger
	onEvent func() // tests: in the dispatch goroutine, before each notification

	// fsMu orders the calls of fs.Add and fs.Remove with the bookkeeping
	// around them. It is taken before mu, and never by the dispatch
	// goroutine: fsnotify may hold its own lock while it waits for that
	// goroutine to take an event or an error.
	fsMu sync.Mutex

	mu      sync.Mutex
	fs      *fsnotify.Watcher // made by the first follower that needs it
	done    chan struct{}     // closed when the dispatch goroutine returns
	closed  bool
	dirs    map[string]*watchedDir     // by path
	targets map[string]map[*watch]bool // the followers of each file's path
}

// watchedDir is a directory of a Watcher's followers.
type watchedDir struct {
	up    bool   // its watch is up (and not lost with the directory)
	lost  uint64 // how many times it was lost: an Add under way when it is is not up
	id    dirID  // what it was when its watch was put up
	watch map[*watch]bool
}

// dirID is a directory's device and inode.
type dirID struct{ dev, ino uint64 }

// errAliased is a directory that the Watcher watches under another path,
// or a path whose directory is not the one the Watcher watches by it.
var errAliased = errors.New("tail: the directory is watched under another path, or the path names another directory than the one watched by it")

// NewWatcher returns a Watcher whose problems are logged to logger (nil
// discards them). It starts nothing until a follower uses it.
func NewWatcher(logger *slog.Logger) *Watcher {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Watcher{log: logger, dirs: map[string]*watchedDir{}, targets: map[string]map[*watch]bool{}}
}

// Close stops the notifications and releases the inotify instance.
func (w *Watcher) Close() error {
	w.mu.Lock()
	fs, done := w.fs, w.done
	w.closed = true
	w.mu.Unlock()
	if fs == nil {
		return nil
	}
	err := fs.Close()
	<-done
	return err
}

// watch is one follower's share of a Watcher: the notifications of its
// path, and of its directory going away, as wake-ups. At most one wake-up
// is pending, so the dispatch goroutine keeps the kernel queue drained
// however slowly records are consumed.
type watch struct {
	w           *Watcher
	dir, target string
	wake        chan struct{} // 1-buffered
	overflow    atomic.Int64  // overflows not yet seen by the follower
	dirLost     atomic.Bool   // the directory was removed or renamed: its watch is gone
}

func (s *watch) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// join makes s follow target, a path in dir, waking wake, or a channel of
// its own when nil. Its error is the inotify instance's, which cannot be
// made.
func (w *Watcher) join(dir, target string, wake chan struct{}) (*watch, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errors.New("tail: the watcher is closed")
	}
	if w.fs == nil {
		fs, err := fsnotify.NewWatcher()
		if err != nil {
			return nil, inotifyHint(err)
		}
		w.fs, w.done = fs, make(chan struct{})
		go w.run(fs)
	}
	if wake == nil {
		wake = make(chan struct{}, 1)
	}
	s := &watch{w: w, dir: dir, target: target, wake: wake}
	d := w.dirs[dir]
	if d == nil {
		d = &watchedDir{watch: map[*watch]bool{}}
		w.dirs[dir] = d
	}
	d.watch[s] = true
	if w.targets[target] == nil {
		w.targets[target] = map[*watch]bool{}
	}
	w.targets[target][s] = true
	return s, nil
}

// add puts up the watch of s's directory, unless it is up; errAliased when
// the directory is watched under another path.
func (s *watch) add() error {
	w := s.w
	w.fsMu.Lock()
	defer w.fsMu.Unlock()
	w.mu.Lock()
	d := w.dirs[s.dir]
	up, closed, lost, upID := d.up, w.closed, d.lost, d.id
	w.mu.Unlock()
	if closed {
		return errors.New("tail: the watcher is closed")
	}
	fi, err := os.Stat(s.dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("tail: no inode number for " + s.dir)
	}
	id := dirID{uint64(st.Dev), st.Ino}
	switch {
	case up && id == upID:
		return nil
	case up:
		// The path names another directory than the one watched (a
		// symlink retargeted), whose followers the watch still serves.
		return errAliased
	}
	if w.watched(id, s.dir) {
		return errAliased
	}
	if err := w.fs.Add(s.dir); err != nil {
		return inotifyHint(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if d.lost == lost { // else lost while it was put up: put up again
		d.up, d.id = true, id
	}
	return nil
}

// watched reports whether the directory id is watched under another path
// than dir.
func (w *Watcher) watched(id dirID, dir string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for path, d := range w.dirs {
		if d.up && d.id == id && path != dir {
			return true
		}
	}
	return false
}

// leave ends s's share. A directory's watch goes with its last follower.
func (s *watch) leave() {
	w := s.w
	w.fsMu.Lock()
	defer w.fsMu.Unlock()
	w.mu.Lock()
	delete(w.targets[s.target], s)
	if len(w.targets[s.target]) == 0 {
		delete(w.targets, s.target)
	}
	d := w.dirs[s.dir]
	delete(d.watch, s)
	remove := false
	if len(d.watch) == 0 {
		delete(w.dirs, s.dir)
		remove = d.up && !w.closed
	}
	w.mu.Unlock()
	if remove {
		w.fs.Remove(s.dir) // fails when the kernel dropped it with the directory
	}
}

// run hands the notifications on until the fsnotify watcher is closed.
func (w *Watcher) run(fs *fsnotify.Watcher) {
	defer close(w.done)
	for {
		select {
		case ev, ok := <-fs.Events:
			if !ok {
				return
			}
			if w.onEvent != nil {
				w.onEvent()
			}
			w.dispatch(ev)
		case err, ok := <-fs.Errors:
			if !ok {
				return
			}
			overflow := errors.Is(err, fsnotify.ErrEventOverflow)
			if overflow {
				w.log.Warn("file notification queue overflowed; looking at the files", "err", err)
			} else {
				w.log.Warn("file notification error; looking at the files", "err", err)
			}
			w.mu.Lock()
			for _, d := range w.dirs {
				for s := range d.watch {
					if overflow {
						s.overflow.Add(1)
					}
					s.notify()
				}
			}
			w.mu.Unlock()
		}
	}
}

// dispatch wakes the followers of the path an event is about, or all those
// of a directory that went away, whose watch went with it.
func (w *Watcher) dispatch(ev fsnotify.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.dirs[ev.Name]; d != nil && ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0 {
		d.up = false
		d.lost++
		for s := range d.watch {
			s.dirLost.Store(true)
			s.notify()
		}
		return
	}
	if ev.Op&^fsnotify.Chmod == 0 {
		return
	}
	for s := range w.targets[ev.Name] {
		s.notify()
	}
}

// newOwnWatcher returns a Watcher for the follower alone.
func (fl *Follower) newOwnWatcher() *Watcher {
	w := NewWatcher(fl.log)
	w.onEvent = fl.hooks.onEvent
	return w
}

// inotifyHint names the limit behind err, an inotify instance or watch
// that could not be made, when it is one.
func inotifyHint(err error) error {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return fmt.Errorf("%w: the inotify instances of this user are used up (sysctl fs.inotify.max_user_instances), or the descriptors of this process (LimitNOFILE=)", err)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w: the inotify watches of this user are used up (sysctl fs.inotify.max_user_watches)", err)
	}
	return err
}

// ensureWatch sets up the watches of the path's directory and of the file
// a symlink at the path names, those not up, and reports whether one just
// came up, in which case the file must be looked at again: changes before
// it went unnoticed.
func (fl *Follower) ensureWatch() bool {
	if fl.opts.PollOnly {
		return false
	}
	fresh := fl.watchPath()
	if fl.watchLink() {
		fresh = true
	}
	return fresh
}

// watchPath sets up the watch on the path's directory if it is not up, and
// reports whether it just came up.
func (fl *Follower) watchPath() bool {
	if fl.watch == nil {
		w := fl.opts.Watcher
		if w == nil || fl.ownWatcher != nil {
			if fl.ownWatcher == nil {
				fl.ownWatcher = fl.newOwnWatcher()
			}
			w = fl.ownWatcher
		}
		s, err := w.join(fl.dir, fl.target, nil)
		if err != nil {
			if ok, _ := fl.watchLog.Allow(time.Now()); ok {
				fl.log.Warn("cannot watch for file notifications; polling only", "err", err, "poll_interval", fl.opts.PollInterval)
			}
			return false
		}
		fl.watch = s
	}
	if fl.watch.dirLost.Swap(false) {
		fl.watching = false
	}
	if fl.watching {
		return false
	}
	if err := fl.watch.add(); errors.Is(err, errAliased) {
		// Reached by another path than the one watched: a Watcher of its
		// own watches it by this one; a new one when its own watches
		// another directory by this path (a symlink to it retargeted).
		onOwn := fl.watch.w == fl.ownWatcher
		fl.watch.leave()
		fl.watch = nil
		if onOwn {
			fl.dropLink()
			fl.ownWatcher.Close()
			fl.ownWatcher = nil
		}
		if fl.ownWatcher == nil {
			fl.ownWatcher = fl.newOwnWatcher()
		}
		return fl.watchPath()
	} else if err != nil {
		if ok, _ := fl.watchLog.Allow(time.Now()); ok {
			fl.log.Warn("cannot watch the directory; polling until it can", "dir", fl.dir, "err", err, "poll_interval", fl.opts.PollInterval)
		}
		return false
	}
	fl.watching = true
	return true
}

// linkWatch is the watch of the file a symlink at the path names: appends
// to it are notified under its own name, in its own directory, never
// under the path's.
type linkWatch struct {
	watch    *watch // nil when the path is no symlink
	watching bool   // its directory is being watched
	// The end of the symlinks at the path when last looked at, the file
	// there then, and the directory and name to watch it by.
	end         string
	fi          os.FileInfo
	dir, target string
}

// maxLinks bounds the symlinks followed from the path, as the kernel's
// limit (ELOOP).
const maxLinks = 40

// watchLink keeps the watch of the file a symlink at the path names on the
// file it names now, which follows retargets; the watch of a directory
// goes with its last follower. It reports whether it just came up.
func (fl *Follower) watchLink() bool {
	l := &fl.link
	dir, target := fl.linked()
	if s := l.watch; s != nil && (fl.watch == nil || s.target != target || s.wake != fl.watch.wake) {
		fl.dropLink()
	}
	if target == "" || fl.watch == nil {
		return false
	}
	if l.watch == nil {
		s, err := fl.watch.w.join(dir, target, fl.watch.wake)
		if err != nil {
			return false // the path's watch says why
		}
		l.watch = s
	}
	if l.watch.dirLost.Swap(false) {
		l.watching = false
	}
	if l.watching {
		return false
	}
	err := l.watch.add()
	if errors.Is(err, errAliased) && l.watch.w != fl.ownWatcher {
		// Its directory is watched under another path: a Watcher of the
		// follower's own watches it by this one.
		fl.dropLink()
		if fl.ownWatcher == nil {
			fl.ownWatcher = fl.newOwnWatcher()
		}
		if l.watch, err = fl.ownWatcher.join(dir, target, fl.watch.wake); err == nil {
			err = l.watch.add()
		}
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false // the path names no file: the look at the path says so
		}
		if ok, _ := fl.watchLog.Allow(time.Now()); ok {
			fl.log.Warn("cannot watch the directory of the file the symlink at the path names; polling for its appends until it can",
				"dir", dir, "err", err, "poll_interval", fl.opts.PollInterval)
		}
		return false
	}
	l.watching = true
	return true
}

// dropLink ends the watch of the file a symlink at the path named.
func (fl *Follower) dropLink() {
	if l := &fl.link; l.watch != nil {
		l.watch.leave()
		l.watch, l.watching = nil, false
	}
}

// linked returns the directory to watch the file that a symlink at the
// path names by (after every symlink), and the name notifications give
// that file: the path's own directory when it is that one (a symlink to a
// file beside it), else that directory's path without symlinks. Both are
// "" when the path is no symlink, or the directory cannot be found.
func (fl *Follower) linked() (dir, target string) {
	p := fl.path
	for range maxLinks {
		t, err := os.Readlink(p)
		if err != nil {
			break // no symlink (or none there): the end
		}
		if !filepath.IsAbs(t) {
			// Not cleaned: ".." after a symlinked directory is the
			// kernel's to resolve.
			t = p[:strings.LastIndexByte(p, '/')+1] + t
		}
		p = t
	}
	if p == fl.path {
		return "", ""
	}
	l := &fl.link
	fi, err := os.Stat(p)
	if err != nil {
		fi = nil
	}
	if p == l.end && (fi == nil || l.fi != nil && os.SameFile(fi, l.fi)) {
		return l.dir, l.target // unless a symlinked directory on the way was retargeted
	}
	i := strings.LastIndexByte(p, '/')
	raw, name := p[:i], p[i+1:]
	if name == "" || name == "." || name == ".." {
		return "", ""
	}
	if raw == "" {
		raw = "/"
	}
	dir, err = filepath.EvalSymlinks(raw)
	if err != nil {
		return "", ""
	}
	if a, err := os.Stat(dir); err == nil {
		if b, err := os.Stat(fl.dir); err == nil && os.SameFile(a, b) {
			dir = fl.dir
		}
	}
	// fsnotify names events as the watched path, a slash and the name.
	target = dir + "/" + name
	if target == fl.target {
		return "", ""
	}
	l.end, l.fi, l.dir, l.target = p, fi, dir, target
	return dir, target
}

// wait blocks until a notification, the poll interval or ctx ends it, then
// looks at the file and the path.
func (fl *Follower) wait(ctx context.Context) error {
	return fl.waitAtMost(ctx, fl.opts.PollInterval)
}

// waitAtMost is wait with the poll interval cut to d, when d is shorter:
// a file read to its end while the path names another waits for the end
// of its grace, not for the next poll, which a quiet file would otherwise
// wait for before the switch. A wake-up at d is no poll.
func (fl *Follower) waitAtMost(ctx context.Context, d time.Duration) error {
	d = max(min(d, fl.opts.PollInterval), time.Millisecond)
	fl.report()
	fl.logLeftOut()
	fresh := fl.ensureWatch() // before OnWait, which may watch the notifications (Wakeups)
	if fl.opts.OnWait != nil {
		fl.opts.OnWait()
	}
	if fresh {
		return fl.check(false)
	}
	if fl.timer == nil {
		fl.timer = time.NewTimer(d)
	} else {
		fl.timer.Reset(d)
	}
	var wake <-chan struct{}
	if fl.watch != nil {
		wake = fl.watch.wake
	}
	polled := false
	select {
	case <-ctx.Done():
		fl.timer.Stop()
		return ctx.Err()
	case <-wake:
		fl.timer.Stop()
	case <-fl.timer.C:
		polled = d == fl.opts.PollInterval
	}

	if fl.watch != nil {
		n := fl.watch.overflow.Swap(0)
		if l := fl.link.watch; l != nil && l.w != fl.watch.w { // another inotify instance's
			n += l.overflow.Swap(0)
		}
		for range n { // the Watcher logs it
			fl.obs.Event(EventOverflow)
		}
	}
	return fl.check(polled)
}
