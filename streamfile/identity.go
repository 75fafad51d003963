package streamfile

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// Rotation is what [Locate] found in the directory of a path.
type Rotation struct {
	// File is the stream file with the identity looked for, open, and
	// Path its path; nil and "" when the directory holds none.
	File *os.File
	Path string
	// Later are the paths of the other stream files of the directory with
	// the same file name in their header, created after it, but for the one
	// at the path: files rotated after it, in the order of their creation.
	Later []string
}

// Locate looks in the directory of path (of the file a symlink at path
// names) for the stream file with identity id: where a rotation that
// renamed it within its directory (logrotate's default) put it. It opens
// the regular file with its inode number, checks the identity on the open
// file, and lists the files rotated after it (Rotation.Later). Files it
// cannot look at or read are passed over.
func Locate(path string, id Identity) (Rotation, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	var atPath uint64 // the inode of the file at the path, 0 if none
	if fi, err := os.Stat(path); err == nil {
		atPath = inode(fi)
	}
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Rotation{}, err
	}
	var rot Rotation
	type later struct {
		path    string
		created uint64
	}
	var after []later
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // gone since the directory was read
		}
		name := filepath.Join(dir, e.Name())
		switch ino := inode(fi); {
		case ino == id.Ino && rot.File == nil:
			if f := openIdentified(name, id); f != nil {
				rot.File, rot.Path = f, name
			}
		case ino != atPath && ino != id.Ino:
			if h, err := readHeaderFile(name); err == nil && h.FileName == id.FileName && h.CreatedAtMs > id.CreatedAtMs {
				after = append(after, later{name, h.CreatedAtMs})
			}
		}
	}
	if rot.File == nil {
		return Rotation{}, nil
	}
	slices.SortFunc(after, func(a, b later) int { return cmp.Compare(a.created, b.created) })
	for _, l := range after {
		rot.Later = append(rot.Later, l.path)
	}
	return rot, nil
}

// inode returns the inode number of fi, from the operating system.
func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// openIdentified opens the file at path if it has identity id, checked on
// the open file; it returns nil otherwise.
func openIdentified(path string, id Identity) *os.File {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	h, herr := ReadHeader(f)
	fi, serr := f.Stat()
	if herr == nil && serr == nil {
		if got, err := IdentityOf(fi, h); err == nil && got == id {
			return f
		}
	}
	f.Close()
	return nil
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
