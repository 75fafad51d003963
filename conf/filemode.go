package conf

import (
	"fmt"
	"io/fs"
	"strconv"
)

// FileMode is the permission bits of a file streamd creates, written in the
// configuration as an octal string: "0640", "0660". streamd reads and
// appends to the file, so the owner keeps read and write; the bits are set
// as written, whatever the umask.
type FileMode fs.FileMode

// UnmarshalText parses an octal mode such as "0660".
func (m *FileMode) UnmarshalText(text []byte) error {
	v, err := strconv.ParseUint(string(text), 8, 32)
	switch {
	case err != nil || v > 0o777:
		return fmt.Errorf("invalid file mode %q: write the permission bits in octal, as in \"0640\" or \"0660\"", text)
	case v&0o600 != 0o600:
		return fmt.Errorf("file mode %q must give the owner read and write (0600): streamd reads the file and appends to it", text)
	}
	*m = FileMode(v)
	return nil
}

// Set reads a mode as UnmarshalText does: FileMode is a command-line
// flag's value too (streamd publish --file-mode).
func (m *FileMode) Set(text string) error { return m.UnmarshalText([]byte(text)) }

// String returns the mode in octal, as written in the configuration.
func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }
