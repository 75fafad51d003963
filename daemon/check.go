package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/retrytimer"
	"github.com/streamd/streamd/streamfile"
)

// Account is the user whose access to the stream files and the state
// directory a check judges: the daemon's own (currentAccount) or the
// service user `streamd check-config --user` names (lookupAccount).
// Access is judged from the permission bits, as the kernel does without
// ACLs; root may do anything.
type Account struct {
	Name string
	UID  int
	GIDs []int // the primary group and the supplementary ones
}

// currentAccount returns the account of this process: its effective user
// and groups.
func currentAccount() Account {
	uid := os.Geteuid()
	name := strconv.Itoa(uid)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	gids, _ := os.Getgroups() // only fails on a kernel without getgroups(2)
	return Account{Name: name, UID: uid, GIDs: append(gids, os.Getegid())}
}

// lookupAccount returns the account of the named user, or of the user
// with that numeric ID (as systemd's User= takes either), with the groups
// it gets at login (systemd's SupplementaryGroups= of a unit come on top).
func lookupAccount(name string) (Account, error) {
	u, err := user.Lookup(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return Account{}, fmt.Errorf("user %q: %w", name, err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return Account{}, fmt.Errorf("user %q: uid %q is not a number", name, u.Uid)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return Account{}, fmt.Errorf("user %q: groups: %w", name, err)
	}
	a := Account{Name: u.Username, UID: uid}
	for _, id := range append(ids, u.Gid) {
		gid, err := strconv.Atoi(id)
		if err != nil {
			return Account{}, fmt.Errorf("user %q: gid %q is not a number", name, id)
		}
		a.GIDs = append(a.GIDs, gid)
	}
	return a, nil
}

// Permission bits of the owner's class; shifted for the group and others.
const (
	permRead  = 4
	permWrite = 2
	permExec  = 1
)

// may reports whether a may access a file of info with every permission
// of want (permRead, permWrite, permExec).
func (a Account) may(info fs.FileInfo, want fs.FileMode) bool {
	if a.UID == 0 {
		return true
	}
	perm := info.Mode().Perm()
	st, ok := info.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return perm&want == want // not a local file: judged by the others' bits
	case int(st.Uid) == a.UID:
		perm >>= 6
	case slices.Contains(a.GIDs, int(st.Gid)):
		perm >>= 3
	}
	return perm&want == want
}

// describe names the owner, group and mode of a file, for a message.
func describe(info fs.FileInfo) string {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return info.Mode().String()
	}
	owner, group := strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	if g, err := user.LookupGroupId(group); err == nil {
		group = g.Name
	}
	return fmt.Sprintf("%s:%s %04o", owner, group, info.Mode().Perm())
}

// searchable checks that a may reach the entries of dir: search access to
// dir and to each directory above it.
func (a Account) searchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		info, err := os.Stat(d)
		if err == nil && !a.may(info, permExec) {
			return fmt.Errorf("user %s cannot search directory %s (%s): it needs the x permission there", a.Name, d, describe(info))
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// checkReadable checks that a may read the file at path, which what names
// and why says the daemon reads (checkAccess).
func checkReadable(a Account, what, path, why string) error {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs // the directories above a relative path too
	}
	return checkAccess(a, what+": open "+path, path, permRead, why)
}

// checkAccess checks that a has the access want (permRead, permExec) to the
// file at path, which is absolute, and may reach it; what names the file
// and why says what the daemon does with it. A missing file is left to
// the other checks, which say so for any user.
func checkAccess(a Account, what, path string, want fs.FileMode, why string) error {
	info, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if !a.may(info, want) {
		return fmt.Errorf("%s: %w for user %s (%s): %s", what, fs.ErrPermission, a.Name, describe(info), why)
	}
	if err := a.searchable(filepath.Dir(path)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// checkUserFiles checks, for a, another account than the one running
// the check, what that one proved by reading them: the configuration file
// at path, and, with handlers, the files the handlers and the metrics
// server read at start and the exec commands they run.
func checkUserFiles(cfg *conf.Config, path string, handlers bool, a Account) error {
	errs := []error{checkReadable(a, "configuration file", path, "streamd reads it at start and at each reload")}
	if !handlers {
		return errors.Join(errs...)
	}
	const atStart = "streamd reads it when it starts the handler"
	for _, sc := range cfg.Subscriptions {
		h := sc.Handler
		for _, f := range []struct{ key, path string }{
			{"bearer_token_file", h.BearerTokenFile}, {"ca_file", h.CAFile}, {"cert_file", h.CertFile}, {"key_file", h.KeyFile},
			{"creds_file", h.CredsFile}, {"nkey_file", h.NkeyFile}, {"password_file", h.PasswordFile},
		} {
			if f.path != "" {
				errs = append(errs, checkReadable(a, fmt.Sprintf("subscription %q: %s", sc.Name, f.key), f.path, atStart))
			}
		}
		if h.Kind == conf.HandlerExec && len(h.Command) > 0 {
			errs = append(errs, checkExecutable(a, sc.Name, h.Command[0]))
		}
	}
	if f := cfg.Metrics.WebConfigFile; f != "" {
		errs = append(errs, checkReadable(a, "metrics: web_config_file", f, "streamd reads it for each connection"))
	}
	return errors.Join(errs...)
}

// checkExecutable checks that a may run the exec command prog of the
// subscription name, found as the handler finds it.
func checkExecutable(a Account, name, prog string) error {
	path, err := exec.LookPath(prog)
	if err != nil {
		return nil // --handlers says so for any user
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return checkAccess(a, fmt.Sprintf("subscription %q: command %s", name, path), path, permExec, "streamd runs it for each record")
}

// checkFiles checks, writing nothing, what `streamd run` checks at start
// before it uses the files of cfg: the state directory (its access, its
// owner, its sidecar and spool) and each stream file, as a may use them,
// and that no two streams share a file. `streamd check-config` calls it; the daemon
// calls the checks it is made of, checkStateDir, checkSameFile and checkStream, so both
// give the same message for each problem.
func checkFiles(cfg *conf.Config, a Account) error {
	errs := []error{checkStateDir(cfg.StateDir, a), offsets.CheckOwner(cfg.StateDir, a.UID), checkState(cfg.StateDir)}
	for _, s := range cfg.Streams {
		errs = append(errs, checkStream(s, a))
	}
	errs = append(errs, checkSameFile(cfg.Streams))
	return errors.Join(errs...)
}

// checkSameFile checks that no two of streams lead to one file, through a
// symlink, a hard link or another spelling of the path: the configuration
// check refuses only one path named twice. Each stream would read the file
// and append retry copies to it as its own, and what the configuration
// check refuses on one stream, such as a round of dead letters, would pass
// across the two. A file that exists is compared with os.SameFile; a
// missing one by its path with the symlinks resolved.
func checkSameFile(streams []conf.Stream) error {
	type file struct {
		stream   conf.Stream
		resolved string
		info     fs.FileInfo // nil for a missing file
	}
	var files []file
	var errs []error
	for _, s := range streams {
		f := file{stream: s, resolved: resolvedPath(s.Path)}
		f.info, _ = os.Stat(s.Path)
		for _, o := range files {
			if f.resolved == o.resolved || f.info != nil && o.info != nil && os.SameFile(f.info, o.info) {
				errs = append(errs, fmt.Errorf("stream %q: %s is the file of stream %q too (path %s), through a symlink or a hard link: streamd would read it, and append retry copies to it, as two streams; name the file in one [[stream]], and set the stream of the subscriptions of both to that one", s.Name, s.Path, o.stream.Name, o.stream.Path))
				break
			}
		}
		files = append(files, f)
	}
	return errors.Join(errs...)
}

// resolvedPath returns path made absolute with its symlinks resolved; for
// a missing file, or a symlink to one, the path of the file it would be,
// in its directory with the symlinks resolved.
func resolvedPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if p, err := filepath.EvalSymlinks(path); err == nil {
		return p
	}
	path, _ = linkTarget(path)
	if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(dir, filepath.Base(path))
	}
	return path
}

// checkStateDir checks that a may use dir, or create it: run makes a
// missing state directory with its parents.
func checkStateDir(dir string, a Account) error {
	d := dir
	info, err := os.Stat(d)
	for errors.Is(err, fs.ErrNotExist) && d != filepath.Dir(d) {
		d = filepath.Dir(d)
		info, err = os.Stat(d)
	}
	switch {
	case err != nil:
		return fmt.Errorf("state directory: %w", err)
	case !info.IsDir():
		return fmt.Errorf("state directory: %s is not a directory", d)
	case d != dir && !a.may(info, permWrite|permExec):
		return fmt.Errorf("state directory: %s is missing and user %s cannot create it in %s (%s); create it for that user, or let systemd's StateDirectory= make it", dir, a.Name, d, describe(info))
	case d == dir && !a.may(info, permRead|permWrite|permExec):
		return fmt.Errorf("state directory: user %s cannot read and write %s (%s): streamd keeps its positions and retry spool there", a.Name, dir, describe(info))
	}
	if err := a.searchable(filepath.Dir(d)); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return writableStateDir(dir, d, unix.Statfs)
}

// writableStateDir checks that the state directory dir, or existing, the
// directory above it that run makes it in, is on a file system mounted
// read-write, as statfs (unix.Statfs; a fake in tests) reports it: the
// permission bits allow what a read-only mount refuses, and run would stop
// at its lock file.
func writableStateDir(dir, existing string, statfs func(string, *unix.Statfs_t) error) error {
	ro, err := readOnly(existing, statfs)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if !ro {
		return nil
	}
	what := dir + " is"
	if existing != dir {
		what = fmt.Sprintf("%s is missing, and %s, which streamd would make it in, is", dir, existing)
	}
	return fmt.Errorf("state directory: %s on a read-only file system: streamd keeps its positions and retry spool there; set state_dir to a directory on a writable file system, or, under systemd (ProtectSystem=strict makes all but the unit's state directory and ReadWritePaths= read-only), leave state_dir out to use the unit's StateDirectory=", what)
}

// checkState checks the sidecar and the retry spool in the state
// directory dir as run reads them at its start, without taking the
// directory's lock: run refuses a corrupt one, and a missing sidecar next
// to a spool. What the user running the check may not read is left out:
// checkStateDir judges the access of the daemon's user.
func checkState(dir string) error {
	if _, err := offsets.LoadMarked(dir, retrytimer.SpoolName); err != nil && !errors.Is(err, fs.ErrPermission) {
		return err
	}
	if err := retrytimer.Check(dir); err != nil && !errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("retrytimer: %w", err)
	}
	return nil
}

// checkStream checks the stream file of s as openStream will open it, for
// a: a stream file it may read and append to, or, with create, a missing
// file it may create in an existing directory.
func checkStream(s conf.Stream, a Account) error {
	info, err := os.Stat(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		if target, ok := linkTarget(s.Path); ok {
			return danglingLink(s, target)
		}
		if !s.Create {
			return fmt.Errorf("stream %q: %w (create = false: the file must exist)", s.Name, err)
		}
		return checkCreate(s, a)
	}
	if err != nil {
		return fmt.Errorf("stream %q: %w", s.Name, err)
	}
	switch {
	case info.IsDir():
		return fmt.Errorf("stream %q: %s is a directory: path names the stream file itself, as in %s", s.Name, s.Path, filepath.Join(s.Path, s.Name+".ss"))
	case !info.Mode().IsRegular():
		return fmt.Errorf("stream %q: %s is not a regular file (%s)", s.Name, s.Path, info.Mode().Type())
	case !a.may(info, permRead|permWrite):
		return fmt.Errorf("stream %q: open %s: %w for user %s (%s): streamd reads the file and appends retry copies to it: its user needs read and write access (see file_mode, and the README's shared files)", s.Name, s.Path, fs.ErrPermission, a.Name, describe(info))
	}
	if err := a.searchable(filepath.Dir(s.Path)); err != nil {
		return fmt.Errorf("stream %q: %w", s.Name, err)
	}
	if err := writableMount(s, false, unix.Statfs); err != nil {
		return err
	}
	if info.Size() == 0 {
		if !s.Create {
			return fmt.Errorf("stream %q: %s is empty and create = false: streamd would have to write its header", s.Name, s.Path)
		}
		return nil
	}
	f, err := streamfile.OpenRegular(s.Path)
	if err != nil {
		return fmt.Errorf("stream %q: %w", s.Name, err)
	}
	defer f.Close()
	if _, err := streamfile.ReadHeader(f); err != nil {
		if errors.Is(err, streamfile.ErrTruncated) {
			return fmt.Errorf("stream %q: %s has an incomplete %d-byte header: a writer died while creating it; remove the file", s.Name, s.Path, info.Size())
		}
		return fmt.Errorf("stream %q: %s is not a stream file: %w", s.Name, s.Path, err)
	}
	return nil
}

// linkTarget returns the path that the symlink at path names, following
// the symlinks it names in turn, and whether path is a symlink.
func linkTarget(path string) (string, bool) {
	target := path
	for range 40 { // the kernel's limit of symlinks in a lookup
		info, err := os.Lstat(target)
		if err != nil || info.Mode().Type() != fs.ModeSymlink {
			break
		}
		next, err := os.Readlink(target)
		if err != nil {
			break
		}
		if !filepath.IsAbs(next) {
			next = filepath.Join(filepath.Dir(target), next)
		}
		target = next
	}
	return target, target != path
}

// danglingLink says why the stream file of s is refused: its path is a
// symlink to target, which does not exist. streamd creates no file
// through a symlink (it creates one exclusively, which a symlink at the
// path fails), whatever create says: run waits for the file to appear, as
// for a missing file with create = false.
func danglingLink(s conf.Stream, target string) error {
	dir := filepath.Dir(target)
	what, fix := "which does not exist", "create it (streamd publish --file="+target+" does)"
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		what, fix = "whose directory "+dir+" does not exist", "create the directory and the stream file in it"
	}
	return fmt.Errorf("stream %q: %s is a symlink to %s, %s: streamd does not create a stream file through a symlink, and waits for one there; %s, or point the symlink at the stream file", s.Name, s.Path, target, what, fix)
}

// checkCreate checks that a may create the missing stream file of s.
func checkCreate(s conf.Stream, a Account) error {
	dir := filepath.Dir(s.Path)
	info, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("stream %q: directory %s does not exist: streamd creates the stream file, not its directory; create it", s.Name, dir)
	case err != nil:
		return fmt.Errorf("stream %q: %w", s.Name, err)
	case !info.IsDir():
		return fmt.Errorf("stream %q: %s is not a directory", s.Name, dir)
	case !a.may(info, permWrite|permExec):
		return fmt.Errorf("stream %q: create %s: %w for user %s: it needs write access to %s (%s)", s.Name, s.Path, fs.ErrPermission, a.Name, dir, describe(info))
	}
	if err := a.searchable(dir); err != nil {
		return fmt.Errorf("stream %q: %w", s.Name, err)
	}
	return writableMount(s, true, unix.Statfs)
}

// writableMount checks that the file system of the stream file of s, or,
// with create, of the directory it is to be created in, is mounted
// read-write, as statfs (unix.Statfs; a fake in tests) reports it. The
// permission bits do not tell: a read-only mount, such as everything but
// ReadWritePaths= under the unit's ProtectSystem=strict, refuses the
// appends they allow.
func writableMount(s conf.Stream, create bool, statfs func(string, *unix.Statfs_t) error) error {
	path, dir := s.Path, filepath.Dir(s.Path)
	if create {
		path = dir
	}
	ro, err := readOnly(path, statfs)
	if err != nil {
		return fmt.Errorf("stream %q: %w", s.Name, err)
	}
	if !ro {
		return nil
	}
	what := fmt.Sprintf("%s is on a read-only file system: streamd appends retry copies to it", s.Path)
	if create {
		what = fmt.Sprintf("create %s: directory %s is on a read-only file system", s.Path, dir)
	}
	return fmt.Errorf("stream %q: %s; mount it read-write, or, under systemd (ProtectSystem=strict makes all but the unit's ReadWritePaths= read-only), add the directory with a drop-in: systemctl edit streamd, then [Service] ReadWritePaths=%s", s.Name, what, dir)
}

// readOnly reports whether the file system of path is mounted read-only,
// as statfs reports it.
func readOnly(path string, statfs func(string, *unix.Statfs_t) error) (bool, error) {
	var st unix.Statfs_t
	if err := statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Flags&unix.ST_RDONLY != 0, nil
}
