package streamfile

import (
	"fmt"
	"io/fs"
	"syscall"
)

// Identity identifies one stream file, so that a position stored for it is
// never applied to a file that replaced it at its path. The device and
// inode numbers tell apart files that exist at the same time; the file name
// and creation time of the header tell a file from one created later that
// got the same inode number, or that was truncated and rewritten in place.
type Identity struct {
	// Dev and Ino are the device and inode numbers from stat(2).
	Dev uint64
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
		return Identity{}, fmt.Errorf("streamfile: %s: no device and inode numbers", fi.Name())
	}
	return Identity{Dev: uint64(st.Dev), Ino: st.Ino, FileName: h.FileName, CreatedAtMs: h.CreatedAtMs}, nil
}
