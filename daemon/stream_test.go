package daemon

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/streamfile"
)

// TestOpenStreamLongFileName: the daemon accepts a stream file name longer
// than the header holds (123 bytes, the limit is 111), as streamd publish
// does: the header of the file it creates holds the first 111 bytes.
func TestOpenStreamLongFileName(t *testing.T) {
	name := strings.Repeat("n", 120) + ".ss"
	s, err := openStream(conf.Stream{Name: "long", Path: filepath.Join(t.TempDir(), name), Create: true, BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if got := s.a.Writer().Header().FileName; got != name[:streamfile.MaxFileNameLen] {
		t.Errorf("header file name %q, want the first %d bytes of %q", got, streamfile.MaxFileNameLen, name)
	}
}
