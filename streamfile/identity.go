package streamfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Identity identifies one stream file, so that a position stored for it is
// never applied to a file that replaced it at its path. The inode number
// tells apart files that exist at the same time on the file system of the
// path; the file name and creation time of the header tell a file from one
// created later that got the same inode number, or that was truncated and
// rewritten in place.
//
// The device number is left out on purpose: it is not stable across
// reboots (btrfs subvolumes, NFS and overlayfs get a device number when
// they are mounted, device-mapper minors follow the order of activation),
// and a stored position must still name its file after one. Two files with
// the same inode number and the same header on two file systems (a
// snapshot or a copy of a file system mounted in place of the first) are
// therefore taken for one file. That is the right call for a snapshot,
// which holds the same records at the same offsets, and a position that
// does not fit the file is caught as a truncation. A follower that sees the
// path name another file compares device and inode numbers of two stats in
// one boot (os.SameFile), so it notices such a replacement all the same.
type Identity struct {
	// Ino is the inode number from stat(2).
	Ino uint64
	// FileName and CreatedAtMs come from the file's header: the name the
	// writer stored and the creation time in milliseconds since the epoch.
	FileName    string
	CreatedAtMs uint64
}

// IdentityOf returns the identity of a stream file from its stat
// information, which must come from the operating system (a
// *syscall.Stat_t), and its header.
func IdentityOf(fi fs.FileInfo, h Header) (Identity, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Identity{}, fmt.Errorf("streamfile: %s: no inode number", fi.Name())
	}
	return Identity{Ino: st.Ino, FileName: h.FileName, CreatedAtMs: h.CreatedAtMs}, nil
}

// Locate returns the path of the stream file with identity id in the
// directory of path (of the file a symlink at path names), or "" when it
// holds none: where a rotation that renames the file within its directory
// (logrotate's default) put it. It looks at the regular files of the
// directory for the inode number, and reads the header of the one that has
// it; files it cannot look at or read are passed over.
func Locate(path string, id Identity) (string, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // gone since the directory was read
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Ino != id.Ino {
			continue
		}
		name := filepath.Join(dir, e.Name())
		if h, err := readHeaderFile(name); err == nil && h.FileName == id.FileName && h.CreatedAtMs == id.CreatedAtMs {
			return name, nil
		}
	}
	return "", nil
}

// readHeaderFile reads the header of the file at path.
func readHeaderFile(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	return ReadHeader(f)
}
