package daemon

import (
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNewLoggerDurations checks that every log format writes a duration as
// Go writes it, and that the journal's form carries the level only in its
// priority prefix.
func TestNewLoggerDurations(t *testing.T) {
	for _, tc := range []struct {
		format  string
		journal bool
		want    string
	}{
		{"json", false, `"msg":"stopping","shutdown_timeout":"20s","wait":"1.5ms"}`},
		{"text", false, ` level=INFO msg=stopping shutdown_timeout=20s wait=1.5ms` + "\n"},
		{"auto", true, "<6>msg=stopping shutdown_timeout=20s wait=1.5ms\n"},
	} {
		t.Run(tc.format, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "log"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			t.Setenv("JOURNAL_STREAM", "")
			if tc.journal {
				var st syscall.Stat_t
				if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
					t.Fatal(err)
				}
				t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
			}
			logger, _, err := newLogger(f, "info", tc.format)
			if err != nil {
				t.Fatal(err)
			}
			logger.Info("stopping", "shutdown_timeout", 20*time.Second, "wait", 1500*time.Microsecond)
			b, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			if got := string(b); !strings.Contains(got, tc.want) || tc.journal && got != tc.want {
				t.Errorf("format %s wrote %q, want %q in it", tc.format, got, tc.want)
			}
		})
	}
}

// TestNewProcessLogger: what the standard library logs goes to the new
// logger as a warning, without the log package's own prefix, so the level
// filters it; a logger that cannot be made leaves the log package alone.
func TestNewProcessLogger(t *testing.T) {
	flags, out := log.Flags(), log.Writer()
	t.Cleanup(func() {
		log.SetFlags(flags)
		log.SetOutput(out)
	})
	t.Setenv("JOURNAL_STREAM", "")
	const warning = `level=WARN msg="http: response on idle connection"`
	for _, tc := range []struct {
		level string
		err   string // NewProcessLogger's error, "" for none
		want  bool   // the warning is in the log
	}{
		{level: "info", want: true},
		{level: "error"},
		{level: "loud", err: `log level "loud": use debug, info, warn or error`},
	} {
		t.Run(tc.level, func(t *testing.T) {
			log.SetOutput(io.Discard)
			f, err := os.Create(filepath.Join(t.TempDir(), "log"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, _, err := NewProcessLogger(f, tc.level, "text"); !hasPrefix(err, tc.err) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
			log.Print("http: response on idle connection")
			b, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(b), warning); got != tc.want {
				t.Errorf("log %q has %q: %v, want %v", b, warning, got, tc.want)
			}
		})
	}
}
