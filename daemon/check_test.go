package daemon

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/streamfile"
)

// TestCheckStream: each stream path start would refuse is refused by the
// check, naming the stream and the reason, and usable ones pass.
func TestCheckStream(t *testing.T) {
	skipUnlessRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	stream := filepath.Join(dir, "orders.ss")
	w, err := streamfile.OpenWriter(stream, streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: "orders.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	os.Chmod(stream, 0o644)
	notSS := filepath.Join(dir, "passwd")
	os.WriteFile(notSS, []byte(strings.Repeat("root:x:0:0:root:/root:/bin/bash\n", 4)), 0o644)
	empty := filepath.Join(dir, "empty.ss")
	os.WriteFile(empty, nil, 0o644)
	// Symlinks to a file that is not there, which streamd does not create
	// through them: to a missing directory, to a missing file, and to
	// such a symlink; and a relative one to the stream file.
	noDir, noFile, chain, good := filepath.Join(dir, "nodir.ss"), filepath.Join(dir, "nofile.ss"), filepath.Join(dir, "chain.ss"), filepath.Join(dir, "good.ss")
	os.Symlink(filepath.Join(dir, "none", "x.ss"), noDir)
	os.Symlink("x.ss", noFile)
	os.Symlink("nofile.ss", chain)
	os.Symlink("orders.ss", good)
	root := Account{Name: "root"}
	nobody := Account{Name: "nobody", UID: 65534, GIDs: []int{65534}}
	const noLink = ": streamd does not create a stream file through a symlink, and waits for one there; "
	for _, tc := range []struct {
		name   string
		path   string
		create bool
		who    Account
		want   string // "" passes
	}{
		{"symlink to the stream file", good, false, root, ""},
		{"symlink, missing directory", noDir, true, root, `stream "s": ` + noDir + " is a symlink to " + filepath.Join(dir, "none", "x.ss") + ", whose directory " + filepath.Join(dir, "none") + " does not exist" + noLink + "create the directory and the stream file in it, or point the symlink at the stream file"},
		{"symlink, missing file", noFile, true, root, `stream "s": ` + noFile + " is a symlink to " + filepath.Join(dir, "x.ss") + ", which does not exist" + noLink + "create it (streamd publish --file=" + filepath.Join(dir, "x.ss") + " does), or point the symlink at the stream file"},
		{"symlink, create = false", noFile, false, root, `stream "s": ` + noFile + " is a symlink to " + filepath.Join(dir, "x.ss") + ", which does not exist"},
		{"symlink to a symlink", chain, true, root, `stream "s": ` + chain + " is a symlink to " + filepath.Join(dir, "x.ss") + ", which does not exist"},
		{"stream file", stream, false, root, ""},
		{"missing, created", filepath.Join(dir, "new.ss"), true, root, ""},
		{"empty, created", empty, true, root, ""},
		{"directory", dir, true, root, `stream "s": ` + dir + " is a directory: path names the stream file itself, as in " + filepath.Join(dir, "s.ss")},
		{"not a stream file", notSS, true, root, `stream "s": ` + notSS + " is not a stream file: streamfile: "},
		{"missing parent", filepath.Join(dir, "none", "orders.ss"), true, root, `stream "s": directory ` + filepath.Join(dir, "none") + " does not exist: streamd creates the stream file, not its directory; create it"},
		{"create = false, missing", filepath.Join(dir, "none.ss"), false, root, `stream "s": stat ` + filepath.Join(dir, "none.ss") + ": no such file or directory (create = false: the file must exist)"},
		{"empty, create = false", empty, false, root, `stream "s": ` + empty + " is empty and create = false: streamd would have to write its header"},
		{"unwritable for the user", stream, false, nobody, `stream "s": open ` + stream + ": permission denied for user nobody (root:root 0644): streamd reads the file and appends retry copies to it: its user needs read and write access"},
		{"uncreatable for the user", filepath.Join(dir, "new.ss"), true, nobody, `stream "s": create ` + filepath.Join(dir, "new.ss") + ": permission denied for user nobody: it needs write access to " + dir + " (root:root 0755)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkStream(conf.Stream{Name: "s", Path: tc.path, Create: tc.create}, tc.who)
			checkRefusal(t, err, tc.want)
		})
	}
}

// TestCheckSameFile: two streams whose paths lead to one file, existing or
// to be created, are refused, naming both; streams on their own files pass.
func TestCheckSameFile(t *testing.T) {
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }
	for _, name := range []string{"a.ss", "b.ss"} {
		if err := os.WriteFile(at(name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, err := range []error{
		os.Symlink("a.ss", at("link.ss")), os.Link(at("a.ss"), at("hard.ss")),
		os.Symlink("new.ss", at("dangling.ss")), os.Symlink(dir, at("dirlink")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	const shared = " through a symlink or a hard link: streamd would read it, and append retry copies to it, as two streams; name the file in one [[stream]], and set the stream of the subscriptions of both to that one"
	for _, tc := range []struct {
		name  string
		paths []string // of streams s0, s1, ...
		want  string   // "" passes
	}{
		{"own files", []string{at("a.ss"), at("b.ss"), at("new.ss")}, ""},
		{"symlink", []string{at("a.ss"), at("link.ss")}, `stream "s1": ` + at("link.ss") + ` is the file of stream "s0" too (path ` + at("a.ss") + "),"},
		{"hard link", []string{at("hard.ss"), at("b.ss"), at("a.ss")}, `stream "s2": ` + at("a.ss") + ` is the file of stream "s0" too (path ` + at("hard.ss") + ")," + shared},
		{"symlink to a missing file", []string{at("new.ss"), at("dangling.ss")}, `stream "s1": ` + at("dangling.ss") + ` is the file of stream "s0" too`},
		{"missing file in a symlinked directory", []string{at("new.ss"), filepath.Join(at("dirlink"), "new.ss")}, `stream "s1": ` + filepath.Join(at("dirlink"), "new.ss") + ` is the file of stream "s0" too`},
		{"existing file in a symlinked directory", []string{filepath.Join(at("dirlink"), "b.ss"), at("b.ss")}, `stream "s1": ` + at("b.ss") + ` is the file of stream "s0" too`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var streams []conf.Stream
			for i, p := range tc.paths {
				streams = append(streams, conf.Stream{Name: fmt.Sprintf("s%d", i), Path: p})
			}
			err := checkSameFile(streams)
			checkRefusal(t, err, tc.want)
		})
	}
}

// checkRefusal fails t unless err begins with want, or, with want "", is
// nil.
func checkRefusal(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("refused: %v", err)
	case want != "" && err == nil:
		t.Errorf("passed, want %q", want)
	case want != "" && !strings.HasPrefix(err.Error(), want):
		t.Errorf("error:\n%v\nwant it to begin:\n%s", err, want)
	}
}

// TestCheckStateDir: the state directory must be usable, or creatable, by
// the account.
func TestCheckStateDir(t *testing.T) {
	skipUnlessRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	nobody := Account{Name: "nobody", UID: 65534, GIDs: []int{65534}}
	if err := checkStateDir(filepath.Join(dir, "a", "b"), Account{Name: "root"}); err != nil {
		t.Errorf("a missing directory root can create: %v", err)
	}
	want := "state directory: " + filepath.Join(dir, "a") + " is missing and user nobody cannot create it in " + dir + " (root:root 0755)"
	if err := checkStateDir(filepath.Join(dir, "a"), nobody); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want it to begin %q", err, want)
	}
	want = "state directory: user nobody cannot read and write " + dir + " (root:root 0755)"
	if err := checkStateDir(dir, nobody); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %v, want it to begin %q", err, want)
	}
	if err := checkStateDir(dir, Account{Name: "owner", UID: 0}); err != nil {
		t.Error(err)
	}
}

// TestWritableStateDir: a state directory on a read-only mount, or the
// directory run would make a missing one in, is refused whatever its
// permission bits allow, saying how to choose one that is writable; the
// mount flags come from a fake statfs.
func TestWritableStateDir(t *testing.T) {
	const fix = " on a read-only file system: streamd keeps its positions and retry spool there; set state_dir to a directory on a writable file system, or, under systemd (ProtectSystem=strict makes all but the unit's state directory and ReadWritePaths= read-only), leave state_dir out to use the unit's StateDirectory="
	for _, tc := range []struct {
		name, dir, existing string
		flags               int64
		err                 error
		want                string // "" passes
	}{
		{"read-write", "/srv/state", "/srv/state", unix.ST_NOSUID, nil, ""},
		{"read-write, missing", "/srv/state", "/srv", 0, nil, ""},
		{"read-only", "/srv/state", "/srv/state", unix.ST_RDONLY, nil, "state directory: /srv/state is" + fix},
		{"read-only, missing", "/srv/state/a", "/srv", unix.ST_RDONLY | unix.ST_NODEV, nil, "state directory: /srv/state/a is missing, and /srv, which streamd would make it in, is" + fix},
		{"statfs fails", "/srv/state", "/srv/state", 0, syscall.EIO, "state directory: statfs /srv/state: input/output error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkStatfs(t, tc.flags, tc.err, tc.existing, tc.want, func(statfs statfsFunc) error {
				return writableStateDir(tc.dir, tc.existing, statfs)
			})
		})
	}
}

// statfsFunc is unix.Statfs, or a fake of it.
type statfsFunc = func(string, *unix.Statfs_t) error

// checkStatfs runs check with a fake statfs that reports the mount flags,
// or fails with fail, and checks that check asked it of path and returned
// want ("" for nil), wrapping fail.
func checkStatfs(t *testing.T, flags int64, fail error, path, want string, check func(statfsFunc) error) {
	t.Helper()
	var asked string
	err := check(func(p string, st *unix.Statfs_t) error {
		asked = p
		st.Flags = flags
		return fail
	})
	if asked != path {
		t.Errorf("statfs of %s, want of %s", asked, path)
	}
	switch {
	case want == "" && err != nil:
		t.Errorf("refused: %v", err)
	case want != "" && (err == nil || err.Error() != want):
		t.Errorf("error:\n%v\nwant:\n%s", err, want)
	case fail != nil && !errors.Is(err, fail):
		t.Errorf("error %v does not wrap %v", err, fail)
	}
}

// TestWritableMount: a stream file on a read-only mount, or the directory
// one is to be created in, is refused whatever its permission bits allow,
// naming the path and the drop-in that makes it writable under systemd;
// the mount flags come from a fake statfs.
func TestWritableMount(t *testing.T) {
	const (
		path = "/srv/streams/orders.ss"
		dir  = "/srv/streams"
	)
	fix := "; mount it read-write, or, under systemd (ProtectSystem=strict makes all but the unit's ReadWritePaths= read-only), add the directory with a drop-in: systemctl edit streamd, then [Service] ReadWritePaths=" + dir
	for _, tc := range []struct {
		name   string
		create bool
		flags  int64
		err    error
		want   string // "" passes
	}{
		{"read-write file", false, 0, nil, ""},
		{"read-write directory", true, unix.ST_NOSUID | unix.ST_NODEV, nil, ""},
		{"read-only file", false, unix.ST_RDONLY, nil, `stream "s": ` + path + " is on a read-only file system: streamd appends retry copies to it" + fix},
		{"read-only directory", true, unix.ST_RDONLY | unix.ST_NOSUID, nil, `stream "s": create ` + path + ": directory " + dir + " is on a read-only file system" + fix},
		{"statfs fails", false, 0, syscall.EIO, `stream "s": statfs ` + path + ": input/output error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkStatfs(t, tc.flags, tc.err, map[bool]string{false: path, true: dir}[tc.create], tc.want, func(statfs statfsFunc) error {
				return writableMount(conf.Stream{Name: "s", Path: path, Create: tc.create}, tc.create, statfs)
			})
		})
	}
}

// readOnlyDirEnv names, in the environment of the test binary that
// TestCheckStreamReadOnlyMount starts, the directory to mount read-only.
const readOnlyDirEnv = "STREAMD_TEST_READ_ONLY_DIR"

// TestCheckStreamReadOnlyMount: a stream file that its permission bits let
// streamd write, and a directory they let it create one in, are refused
// once the directory is bind-mounted read-only, as ProtectSystem=strict
// mounts it; so are the directory as the state directory, and a state
// directory to be made in it. The test runs itself again in a user and mount namespace of
// its own, where it may mount without privileges, and skips where the
// kernel allows no such namespace.
func TestCheckStreamReadOnlyMount(t *testing.T) {
	if dir := os.Getenv(readOnlyDirEnv); dir != "" {
		checkReadOnlyMount(t, dir)
		return
	}
	dir := t.TempDir()
	w, err := streamfile.OpenWriter(filepath.Join(dir, "orders.ss"), streamfile.CreateOptions{Create: true, Header: streamfile.Header{FileName: "orders.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckStreamReadOnlyMount$", "-test.v")
	cmd.Env = append(os.Environ(), readOnlyDirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err != nil && !errors.As(err, &exit):
		t.Skipf("no user and mount namespace here: %v", err)
	case err != nil:
		t.Fatalf("in a mount namespace: %v\n%s", err, out)
	case !strings.Contains(string(out), "--- PASS: TestCheckStreamReadOnlyMount"):
		t.Fatalf("in a mount namespace, the test did not pass:\n%s", out)
	}
}

// checkReadOnlyMount is TestCheckStreamReadOnlyMount in its namespace:
// the stream file in dir and a new one pass, then dir is bind-mounted
// read-only over itself, and both are refused.
func checkReadOnlyMount(t *testing.T, dir string) {
	streams := []struct {
		stream conf.Stream
		want   string
	}{
		{conf.Stream{Name: "orders", Path: filepath.Join(dir, "orders.ss")}, filepath.Join(dir, "orders.ss") + " is on a read-only file system"},
		{conf.Stream{Name: "new", Path: filepath.Join(dir, "new.ss"), Create: true}, "directory " + dir + " is on a read-only file system"},
	}
	root := Account{Name: "root"}
	for _, s := range streams {
		if err := checkStream(s.stream, root); err != nil {
			t.Fatalf("before the read-only mount: %v", err)
		}
	}
	if err := checkStateDir(filepath.Join(dir, "state"), root); err != nil {
		t.Fatalf("before the read-only mount: %v", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount %s: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
	for _, s := range streams {
		if err := checkStream(s.stream, root); err == nil || !strings.Contains(err.Error(), s.want) {
			t.Errorf("stream %q on a read-only mount: error %v, want it to say %q", s.stream.Name, err, s.want)
		}
	}
	for state, want := range map[string]string{
		dir:                         "state directory: " + dir + " is on a read-only file system",
		filepath.Join(dir, "state"): "state directory: " + filepath.Join(dir, "state") + " is missing, and " + dir + ", which streamd would make it in, is on a read-only file system",
	} {
		if err := checkStateDir(state, root); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("state directory %s on a read-only mount: error %v, want it to begin %q", state, err, want)
		}
	}
}

// skipUnlessRoot skips a test whose files must belong to root:root.
func skipUnlessRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the test's files must belong to root:root, as they do when the tests run as root")
	}
}

// TestLookupAccount: a user is found by name or by numeric ID, as
// systemd's User= takes either; an unknown one is an error naming it.
func TestLookupAccount(t *testing.T) {
	u, err := user.LookupId(strconv.Itoa(os.Getuid()))
	if err != nil {
		t.Skip(err)
	}
	byName, err := lookupAccount(u.Username)
	if err != nil {
		t.Fatal(err)
	}
	byID, err := lookupAccount(u.Uid)
	if err != nil || !reflect.DeepEqual(byID, byName) {
		t.Errorf("by ID %s: %+v, %v; by name %s: %+v", u.Uid, byID, err, u.Username, byName)
	}
	for _, name := range []string{"no-such-user-here", "4294967294"} {
		if _, err := lookupAccount(name); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("lookupAccount(%q): %v, want an error naming it", name, err)
		}
	}
}
