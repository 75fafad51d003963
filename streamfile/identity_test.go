package streamfile

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestIdentityOf(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.ss")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h := Header{FileName: "a.ss", CreatedAtMs: 1694767177437, BeaconInterval: 1024}
	identity := func(path string, h Header) Identity {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		id, err := IdentityOf(fi, h)
		if err != nil {
			t.Fatalf("IdentityOf: %v", err)
		}
		return id
	}

	id := identity(path, h)
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	want := Identity{Ino: st.Ino, FileName: "a.ss", CreatedAtMs: 1694767177437}
	if id != want {
		t.Fatalf("IdentityOf = %+v, want %+v", id, want)
	}

	// A rename keeps the file; another file, or a new header in the same
	// file, makes another one.
	moved := filepath.Join(dir, "b.ss")
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	if got := identity(moved, h); got != id {
		t.Errorf("renamed file: %+v, want %+v", got, id)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := identity(path, h); got == id {
		t.Errorf("another file at the path has the identity of the first: %+v", got)
	}
	rewritten := h
	rewritten.CreatedAtMs++
	if got := identity(moved, rewritten); got == id {
		t.Errorf("a new header keeps the identity: %+v", got)
	}
}

// fakeInfo is a FileInfo that does not come from stat(2).
type fakeInfo struct{}

func (fakeInfo) Name() string       { return "fake.ss" }
func (fakeInfo) Size() int64        { return 0 }
func (fakeInfo) Mode() fs.FileMode  { return 0 }
func (fakeInfo) ModTime() time.Time { return time.Time{} }
func (fakeInfo) IsDir() bool        { return false }
func (fakeInfo) Sys() any           { return nil }

func TestIdentityOfNoStat(t *testing.T) {
	_, err := IdentityOf(fakeInfo{}, Header{FileName: "fake.ss"})
	if err == nil || !strings.Contains(err.Error(), "fake.ss: no inode number") {
		t.Fatalf("got %v, want an error naming the file", err)
	}
}

// TestLocate finds a file renamed within the directory of the path by its
// identity; a file with its inode but another header is not it.
// NextRotated goes from it to the files of its name rotated after it, in
// the order of their creation, to none before the one at the path.
func TestLocate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	write := func(name string, created uint64) Identity {
		t.Helper()
		p := filepath.Join(dir, name)
		h := Header{FileName: "r.ss", CreatedAtMs: created, BeaconInterval: 1024}
		b, err := AppendHeader(nil, &h)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		id, err := IdentityOf(fi, h)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	ids := map[string]Identity{}
	for _, f := range []struct {
		name    string
		created uint64
	}{{"r.ss.3", 10}, {"r.ss.1", 30}, {"r.ss.2", 20}, {"r.ss", 40}, {"copy-of-2", 20}, {"earlier", 5}, {"later-than-the-path", 50}} {
		ids[f.name] = write(f.name, f.created)
	}
	if err := os.WriteFile(filepath.Join(dir, "not-a-stream-file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	f, err := Locate(path, ids["r.ss.3"])
	if err != nil || f == nil {
		t.Fatalf("Locate = %v, %v; want r.ss.3", f, err)
	}
	f.Close()
	if want := filepath.Join(dir, "r.ss.3"); f.Name() != want {
		t.Errorf("found %s, want %s", f.Name(), want)
	}
	rewritten := ids["r.ss.3"]
	rewritten.CreatedAtMs = 9
	if f, err := Locate(path, rewritten); err != nil || f != nil {
		t.Errorf("Locate of a header the file with the inode does not have = %v, %v; want none", f, err)
	}

	// r.ss.3, then r.ss.2 or its copy (once), r.ss.1, and the path.
	var chain []string
	for after := ids["r.ss.3"].CreatedAtMs; ; {
		f, err := NextRotated(path, "r.ss", after)
		if err != nil {
			t.Fatal(err)
		}
		if f == nil {
			break
		}
		f.Close()
		chain = append(chain, filepath.Base(f.Name()))
		after = ids[filepath.Base(f.Name())].CreatedAtMs
	}
	if len(chain) != 2 || chain[0] != "r.ss.2" && chain[0] != "copy-of-2" || chain[1] != "r.ss.1" {
		t.Errorf("rotated after r.ss.3: %q, want r.ss.2 (or its copy) and r.ss.1", chain)
	}
}

// TestLocateCopy: a copy of a file is found by its header, in another
// inode, the longest of those at least minSize long; not the file itself.
func TestLocateCopy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ss")
	h := Header{FileName: "r.ss", CreatedAtMs: 7, BeaconInterval: 1024}
	head, err := AppendHeader(nil, &h)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte, extra int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), append(slices.Clone(b), make([]byte, extra)...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("r.ss", head, 100)
	write("r.ss.1", head, 300) // the copy
	write("r.ss.2", head, 200) // a shorter one
	other := h
	other.CreatedAtMs = 8
	otherHead, _ := AppendHeader(nil, &other)
	write("r.ss.3", otherHead, 500) // another file of the same name
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := IdentityOf(fi, h)
	for _, tc := range []struct {
		min  int64
		want string
	}{{0, "r.ss.1"}, {HeaderSize + 300, "r.ss.1"}, {HeaderSize + 301, ""}} {
		f, err := LocateCopy(path, id, tc.min)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if f != nil {
			got = filepath.Base(f.Name())
			f.Close()
		}
		if got != tc.want {
			t.Errorf("LocateCopy(min %d) = %q, want %q", tc.min, got, tc.want)
		}
	}
}

// TestNextRotatedAcrossCutNames: after a file whose header holds a long
// name cut plainly (as files were created before cut names ended in a
// hash), the files of the path rotated after it, whose headers hold the
// name cut as it is now, are read next; a file of another stream whose
// name begins alike is not.
func TestNextRotatedAcrossCutNames(t *testing.T) {
	dir := t.TempDir()
	base := strings.Repeat("заказы_", 10) + "москва.ss"
	path := filepath.Join(dir, base)
	legacy, whole := encodeFileName(base, MaxFileNameLen)
	if whole {
		t.Fatal("the name fits the header")
	}
	write := func(name, headerName string, created uint64) {
		t.Helper()
		b, err := AppendHeader(nil, &Header{FileName: headerName, CreatedAtMs: created, BeaconInterval: 1024})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(base+".2", legacy, 10)
	write(base+".1", headerFileName(path), 20)
	write(base, headerFileName(path), 30)
	other := strings.Repeat("заказы_", 10) + "казань.ss"
	write(other, headerFileName(filepath.Join(dir, other)), 15)
	f, err := NextRotated(path, legacy, 10)
	if err != nil || f == nil {
		t.Fatalf("NextRotated after the file of the plain cut name = %v, %v; want %s.1", f, err, base)
	}
	defer f.Close()
	if want := filepath.Join(dir, base+".1"); f.Name() != want {
		t.Errorf("next %s, want %s", f.Name(), want)
	}
}
