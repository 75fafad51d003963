package streamfile

import (
	"fmt"
	"io/fs"
	"math"
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

// Locate returns, open, the stream file with identity id in the directory
// of path (of the file a symlink at path names), or nil when there is none:
// where a rotation that renamed it within its directory (logrotate's
// default) put it. The identity is checked on the open file. Its path is
// the file's Name.
func Locate(path string, id Identity) (*os.File, error) {
	dir, err := rotationDir(path)
	if err != nil {
		return nil, err
	}
	for _, fi := range dir.files {
		if Inode(fi) == id.Ino {
			return openIdentified(filepath.Join(dir.name, fi.Name()), id), nil
		}
	}
	return nil, nil
}

// LocateCopy returns, open, a copy of the stream file with identity id in
// the directory of path (of the file a symlink at path names), at least
// minSize bytes long, or nil when there is none: a regular file of another
// inode with the same header, where logrotate's copytruncate put the
// file's records before it truncated the file. Of several, it returns the
// longest. The header is checked on the open file. Its path is the file's
// Name.
func LocateCopy(path string, id Identity, minSize int64) (*os.File, error) {
	dir, err := rotationDir(path)
	if err != nil {
		return nil, err
	}
	var best string
	var bestID Identity
	var bestSize int64
	for _, fi := range dir.files {
		if Inode(fi) == id.Ino || fi.Size() < max(minSize, HeaderSize) || best != "" && fi.Size() <= bestSize {
			continue
		}
		name := filepath.Join(dir.name, fi.Name())
		h, err := readHeaderFile(name)
		if err != nil || h.FileName != id.FileName || h.CreatedAtMs != id.CreatedAtMs {
			continue
		}
		if hid, err := IdentityOf(fi, h); err == nil {
			best, bestID, bestSize = name, hid, fi.Size()
		}
	}
	if best == "" {
		return nil, nil
	}
	return openIdentified(best, bestID), nil
}

// NextRotated opens the stream file that a rotation put next, in the
// directory of path (of the file a symlink at path names), after the files
// named fileName in their header that were created up to after
// (milliseconds since the epoch): of the files with that name in their
// header, created after that and before the file at the path (if it has a
// header), the first created, checked on the open file. It returns nil
// when there is none: the file at the path comes next; and when no
// regular file is at the path, to be waited for. Files it cannot read are
// passed over.
//
// Going from file to file this way, with after the latest creation time
// read, reads each file of a rotation once, in the order of creation,
// however many rotations happened while the first was read: a copy of one
// (same header) is not read again. Files created in the same millisecond
// as the one before them are passed over. After a file whose header holds
// a long name cut plainly, files with the name cut as it is now (ending in
// a hash) are taken too.
func NextRotated(path, fileName string, after uint64) (*os.File, error) {
	// A long name cut plainly, as files created before cut names ended in
	// a hash: the files rotated after it, created since, have the hashed
	// name of the path (headerFileName).
	hashed := fileName
	if cut, whole := encodeFileName(filepath.Base(path), MaxFileNameLen); !whole && cut == fileName {
		hashed = headerFileName(path)
	}
	for range 3 {
		dir, err := rotationDir(path)
		if err != nil {
			return nil, err
		}
		if dir.atPath == nil || !dir.atPath.Mode().IsRegular() {
			// Nothing tells which files came before the next one at the
			// path: a file to be renamed over it may be waiting in the
			// directory.
			return nil, nil
		}
		before := uint64(math.MaxUint64) // a new file at the path, its header not written yet
		if h, err := readHeaderFile(dir.path); err == nil {
			before = h.CreatedAtMs
		}
		var next string
		var id Identity
		for _, fi := range dir.files {
			if fi.Size() < HeaderSize || os.SameFile(fi, dir.atPath) {
				continue
			}
			name := filepath.Join(dir.name, fi.Name())
			h, err := readHeaderFile(name)
			if err != nil || h.FileName != fileName && h.FileName != hashed || h.CreatedAtMs <= after || h.CreatedAtMs >= before ||
				next != "" && h.CreatedAtMs >= id.CreatedAtMs {
				continue
			}
			if hid, err := IdentityOf(fi, h); err == nil {
				next, id = name, hid
			}
		}
		if next == "" {
			return nil, nil
		}
		if f := openIdentified(next, id); f != nil {
			return f, nil
		}
		// Renamed since the directory was read (logrotate shifting .1 to
		// .2), or unreadable: look again.
	}
	return nil, fmt.Errorf("streamfile: the file rotated next in the directory of %s could not be opened as found, three times", path)
}

// rotation is the directory a rotation of the file at a path renames in.
type rotation struct {
	path   string        // the path, a symlink there followed
	name   string        // the directory
	files  []fs.FileInfo // its regular files
	atPath fs.FileInfo   // the file at the path, nil if none
}

// rotationDir reads the directory of path, or of the file a symlink at
// path names, whether it exists or not (a rotation may have renamed it).
func rotationDir(path string) (rotation, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	} else if target, err := os.Readlink(path); err == nil { // a dangling link
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(path), target)
		}
		path = target
	}
	r := rotation{path: path, name: filepath.Dir(path)}
	entries, err := os.ReadDir(r.name)
	if err != nil {
		return rotation{}, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if fi, err := e.Info(); err == nil { // else gone since the directory was read
			r.files = append(r.files, fi)
		}
	}
	if fi, err := os.Stat(path); err == nil {
		r.atPath = fi
	}
	return r, nil
}

// Inode returns the inode number of fi, from the operating system; 0 for
// another fs.FileInfo.
func Inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// Identify reads an open stream file's header, size and identity.
func Identify(f *os.File) (Header, int64, Identity, error) {
	h, err := ReadHeader(f)
	if err != nil {
		return h, 0, Identity{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		return h, 0, Identity{}, err
	}
	id, err := IdentityOf(fi, h)
	return h, fi.Size(), id, err
}

// openIdentified opens the file at path if it is a regular file of
// identity id, checked on the open file; it returns nil otherwise.
func openIdentified(path string, id Identity) *os.File {
	f, err := OpenRegular(path)
	if err != nil {
		return nil
	}
	if _, _, got, err := Identify(f); err == nil && got == id {
		return f
	}
	f.Close()
	return nil
}

// readHeaderFile reads the header of the file at path, a regular file
// ([OpenRegular]).
func readHeaderFile(path string) (Header, error) {
	f, err := OpenRegular(path)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	return ReadHeader(f)
}
