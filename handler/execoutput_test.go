package handler

import (
	"strings"
	"testing"
	"time"
)

// TestExecDirectives: a directive counts however stdout is cut into
// writes, the last one printed wins, an invalid one is an error, and lines
// too long to be one are ignored without being kept.
func TestExecDirectives(t *testing.T) {
	long := strings.Repeat("x", execDirectiveMax)
	for _, tc := range []struct {
		name   string
		writes []string
		named  bool
		want   Outcome
		err    bool
	}{
		{"none", []string{"hello\n", "world"}, false, Outcome{}, false},
		{"one write", []string{"outcome=drop\n"}, true, Outcome{Kind: OutcomeDrop}, false},
		{"split across writes", []string{"out", "come=a", "ck\n"}, true, Outcome{Kind: OutcomeAck}, false},
		{"last line without newline", []string{"log line\n", "  retry_after=2s\r"}, true, Outcome{Kind: OutcomeRetryAfter, Delay: 2 * time.Second}, false},
		{"last one wins", []string{"outcome=drop\noutcome=ack\n"}, true, Outcome{Kind: OutcomeAck}, false},
		{"invalid", []string{"outcome=maybe\n"}, false, Outcome{}, true},
		{"invalid, then valid", []string{"outcome=maybe\noutcome=drop\n"}, true, Outcome{Kind: OutcomeDrop}, false},
		{"too long", []string{long, "outcome=drop\n"}, false, Outcome{}, false},
		{"after a long line", []string{long + "\n", "outcome=drop"}, true, Outcome{Kind: OutcomeDrop}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w execDirectives
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
			}
			w.finish()
			if w.named != tc.named || (w.err != nil) != tc.err || (tc.named && w.outcome != tc.want) {
				t.Errorf("named %v, outcome %+v, err %v; want named %v, outcome %+v, an error: %v", w.named, w.outcome, w.err, tc.named, tc.want, tc.err)
			}
			if len(w.line) > execDirectiveMax {
				t.Errorf("kept a %d-byte line", len(w.line))
			}
		})
	}
}

// TestTailBufferExcerpt: the excerpt shows the last lines of stderr,
// bounded in lines and bytes, quoted as valid UTF-8.
func TestTailBufferExcerpt(t *testing.T) {
	many := ""
	for i := range 8 {
		many += "line " + string(rune('0'+i)) + "\n"
	}
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
	}{
		{"nothing", nil, ""},
		{"blank", []string{" \n\t\n"}, ""},
		{"one line", []string{"boom\n"}, `: stderr: "boom"`},
		{"the last lines", []string{many}, `: stderr: "line 3\nline 4\nline 5\nline 6\nline 7"`},
		{"the last bytes", []string{strings.Repeat("a", 600) + "z"}, `: stderr: ..."` + strings.Repeat("a", execStderrBytes-1) + `z"`},
		{"more than is kept", []string{strings.Repeat("b", execStderrKeep), "end"}, `: stderr: ..."` + strings.Repeat("b", execStderrBytes-3) + `end"`},
		{"invalid UTF-8", []string{"bad \xff byte"}, `: stderr: "bad ` + "\uFFFD" + ` byte"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b tailBuffer
			for _, s := range tc.writes {
				b.Write([]byte(s))
			}
			if len(b.b) > execStderrKeep {
				t.Errorf("kept %d bytes, more than %d", len(b.b), execStderrKeep)
			}
			if got := b.excerpt(); got != tc.want {
				t.Errorf("excerpt %q, want %q", got, tc.want)
			}
		})
	}
}
