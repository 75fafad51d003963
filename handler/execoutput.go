package handler

import (
	"bytes"
	"fmt"
	"strings"
)

// What an exec handler keeps of its command's output: the directive lines
// of stdout, and the end of stderr for a failure's error.
const (
	// execDirectiveMax is the longest stdout line read as a directive;
	// other output is ignored without being kept.
	execDirectiveMax = 256
	// execStderrKeep is how much of the end of stderr is kept.
	execStderrKeep = 4 << 10
	// execStderrLines and execStderrBytes bound the stderr excerpt in a
	// failure's error.
	execStderrLines = 5
	execStderrBytes = 512
)

// execDirectives reads a command's stdout for directive lines, keeping
// only the line being read.
type execDirectives struct {
	line    []byte // the current line, while it is short enough to be a directive
	long    bool   // the current line is too long to be one
	named   bool   // a valid directive was read last
	outcome Outcome
	err     error // an invalid directive was read last
}

func (w *execDirectives) Write(p []byte) (int, error) {
	n := len(p)
	for {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		if !w.long && len(w.line)+len(part) > execDirectiveMax {
			w.long, w.line = true, w.line[:0]
		}
		if !w.long {
			w.line = append(w.line, part...)
		}
		if i < 0 {
			return n, nil
		}
		w.endLine()
		p = p[i+1:]
	}
}

// finish reads a last line that has no newline.
func (w *execDirectives) finish() {
	if len(w.line) > 0 {
		w.endLine()
	}
}

func (w *execDirectives) endLine() {
	if !w.long {
		line := strings.Trim(string(w.line), " \t\r")
		directive, ok := strings.CutPrefix(line, "outcome=")
		if !ok && strings.HasPrefix(line, "retry_after=") {
			directive, ok = line, true
		}
		if ok {
			w.outcome, w.err = parseOutcomeDirective(directive)
			w.named = w.err == nil
		}
	}
	w.line, w.long = w.line[:0], false
}

// tailBuffer keeps the last execStderrKeep bytes written to it.
type tailBuffer struct {
	b []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= execStderrKeep {
		t.b = append(t.b[:0], p[len(p)-execStderrKeep:]...)
		return n, nil
	}
	if over := len(t.b) + len(p) - execStderrKeep; over > 0 {
		t.b = t.b[:copy(t.b, t.b[over:])]
	}
	t.b = append(t.b, p...)
	return n, nil
}

// excerpt is ": stderr: " and the last lines kept, quoted, or "" when
// there are none.
func (t *tailBuffer) excerpt() string {
	s := strings.TrimRight(string(t.b), " \t\r\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	s = strings.Join(lines[max(len(lines)-execStderrLines, 0):], "\n")
	cut := ""
	if len(s) > execStderrBytes {
		s, cut = s[len(s)-execStderrBytes:], "..."
	}
	return fmt.Sprintf(": stderr: %s%q", cut, strings.ToValidUTF8(s, "\uFFFD"))
}
