package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// writeData returns a write function for Replace that writes data.
func writeData(data string) func(*os.File) error {
	return func(f *os.File) error {
		_, err := f.WriteString(data)
		return err
	}
}

// names returns the names in dir, sorted.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestReplace(t *testing.T) {
	for _, tt := range []struct {
		name string
		old  bool // a file is at the path before
		left bool // a crash left a temporary file
	}{
		{"new file", false, false},
		{"over an old file", true, false},
		{"over a temporary file a crash left", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state")
			if tt.old {
				if err := os.WriteFile(path, []byte("old content, longer than the new"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tt.left {
				if err := os.WriteFile(TempPath(path), []byte("half of a replacement that a crash cut"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			calls := 0
			renamed, err := Replace(path, 0o640, writeData("new"), func() {
				calls++
				if got, err := os.ReadFile(TempPath(path)); err != nil || string(got) != "new" {
					t.Errorf("before the rename, the temporary file holds %q (%v), want %q", got, err, "new")
				}
			})
			if err != nil || !renamed {
				t.Fatalf("Replace: renamed %v, %v", renamed, err)
			}
			if calls != 1 {
				t.Errorf("beforeRename called %d times, want 1", calls)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != "new" {
				t.Errorf("file holds %q (%v), want %q", got, err, "new")
			}
			// A temporary file a crash left keeps its mode when truncated.
			if st, err := os.Stat(path); err != nil {
				t.Error(err)
			} else if want := 0o640 &^ umask(t); !tt.left && st.Mode().Perm() != want {
				t.Errorf("file mode %v, want %v", st.Mode().Perm(), want)
			}
			if got := names(t, dir); !slices.Equal(got, []string{"state"}) {
				t.Errorf("directory holds %q, want only the file", got)
			}
		})
	}
}

// umask returns the process's umask, which new files' modes lose.
func umask(t *testing.T) fs.FileMode {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "probe"), os.O_CREATE|os.O_WRONLY, 0o777)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return 0o777 &^ st.Mode().Perm()
}

// TestReplaceError checks that a replacement that fails before its rename
// leaves the file as it was and no temporary file.
func TestReplaceError(t *testing.T) {
	errWrite := errors.New("disk full")
	for _, tt := range []struct {
		name    string
		write   func(*os.File) error
		prepare func(t *testing.T, path string)
		want    error
	}{
		{
			name: "write fails",
			write: func(f *os.File) error {
				if _, err := f.WriteString("partial"); err != nil {
					return err
				}
				return errWrite
			},
			want: errWrite,
		},
		{
			name:  "write closes the file",
			write: func(f *os.File) error { return f.Close() },
			want:  os.ErrClosed,
		},
		{
			// rename(2) cannot replace a directory with a file.
			name:  "rename fails",
			write: writeData("new"),
			prepare: func(t *testing.T, path string) {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
					t.Fatal(err)
				}
			},
			want: fs.ErrExist,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state")
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tt.prepare != nil {
				tt.prepare(t, path)
			}
			called := false
			renamed, err := Replace(path, 0o600, tt.write, func() { called = true })
			if renamed || !errors.Is(err, tt.want) {
				t.Fatalf("Replace: renamed %v, %v, want not renamed and %v", renamed, err, tt.want)
			}
			if called != (tt.name == "rename fails") {
				t.Errorf("beforeRename called: %v", called)
			}
			if got := names(t, dir); !slices.Equal(got, []string{"state"}) {
				t.Errorf("directory holds %q, want only the file", got)
			}
			if tt.prepare == nil {
				if got, err := os.ReadFile(path); err != nil || string(got) != "old" {
					t.Errorf("file holds %q (%v), want the old content", got, err)
				}
			}
		})
	}
}

func TestReplaceCannotCreateTemp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "state")
	renamed, err := Replace(path, 0o600, func(*os.File) error {
		t.Error("write called without a temporary file")
		return nil
	}, nil)
	if renamed || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Replace: renamed %v, %v, want not renamed and ErrNotExist", renamed, err)
	}
}

func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	if err := SyncDir(dir); err != nil {
		t.Fatalf("SyncDir of a directory: %v", err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("SyncDir of a missing directory: %v, want ErrNotExist", err)
	}
}
