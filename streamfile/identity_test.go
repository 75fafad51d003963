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
// identity, and lists the files with its header's name created after it,
// but for the one at the path; a file with its inode but another header is
// not it.
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
	first := write("r.ss.3", 1)
	write("r.ss.1", 3)
	write("r.ss.2", 2)
	write("r.ss", 4)
	write("earlier", 0)
	if err := os.WriteFile(filepath.Join(dir, "not-a-stream-file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	rot, err := Locate(path, first)
	if err != nil || rot.File == nil {
		t.Fatalf("Locate = %+v, %v; want r.ss.3", rot, err)
	}
	defer rot.File.Close()
	if want := filepath.Join(dir, "r.ss.3"); rot.Path != want {
		t.Errorf("found %s, want %s", rot.Path, want)
	}
	if want := []string{filepath.Join(dir, "r.ss.2"), filepath.Join(dir, "r.ss.1")}; !slices.Equal(rot.Later, want) {
		t.Errorf("later files %q, want %q", rot.Later, want)
	}

	rewritten := first
	rewritten.CreatedAtMs = 9
	if rot, err := Locate(path, rewritten); err != nil || rot.File != nil {
		t.Errorf("Locate of a header the file with the inode does not have = %+v, %v; want none", rot, err)
	}
}
