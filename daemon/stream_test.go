package daemon

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/streamfile"
)

// TestOpenStreamLongFileName: the daemon accepts a stream file name longer
// than the header holds (123 bytes, the limit is 111), in its configuration
// and when it opens the file, as streamd publish does: the header of the
// file it creates holds the first 111 bytes.
func TestOpenStreamLongFileName(t *testing.T) {
	name := strings.Repeat("n", 120) + ".ss"
	cfg, err := loadTestConfig(t, fmt.Sprintf("state_dir = %q\n[[stream]]\nname = \"long\"\npath = %q\n", t.TempDir(), filepath.Join(t.TempDir(), name))+
		"[[subscription]]\nname = \"s\"\nstream = \"long\"\nkey = \"k\"\n[subscription.handler]\nkind = \"discard\"\n", conf.ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openStream(cfg.Streams[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if got := s.a.Writer().Header().FileName; got != name[:streamfile.MaxFileNameLen] {
		t.Errorf("header file name %q, want the first %d bytes of %q", got, streamfile.MaxFileNameLen, name)
	}
}
