package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	root := Account{Name: "root"}
	nobody := Account{Name: "nobody", UID: 65534, GIDs: []int{65534}}
	for _, tc := range []struct {
		name   string
		path   string
		create bool
		who    Account
		want   string // "" passes
	}{
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
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("passed, want %q", tc.want)
			case tc.want != "" && !strings.HasPrefix(err.Error(), tc.want):
				t.Errorf("error:\n%v\nwant it to begin:\n%s", err, tc.want)
			}
		})
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

// skipUnlessRoot skips a test whose files must belong to root:root.
func skipUnlessRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the test's files must belong to root:root, as they do when the tests run as root")
	}
}
