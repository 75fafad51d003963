package handler

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/internal/ratelog"
)

// The environment of the exec handler's command carries, besides the
// daemon's own and the configured env, the delivery's metadata (see
// deliveryMeta) and the record headers.
const (
	// execHeaderEnvPrefix carries a record header whose value is valid
	// UTF-8 without NUL, as is. The name follows the prefix in upper case,
	// each byte other than A-Z and 0-9 written '_': content-type becomes
	// STREAMD_HEADER_CONTENT_TYPE.
	execHeaderEnvPrefix = "STREAMD_HEADER_"
	// execBase64HeaderEnvPrefix carries any other record header value, in
	// standard base64 with padding, its name written as above.
	execBase64HeaderEnvPrefix = "STREAMD_BASE64_HEADER_"
	// execPayloadLengthEnv carries the payload's length in bytes, so that a
	// command can check it read the whole payload from stdin.
	execPayloadLengthEnv = "STREAMD_PAYLOAD_LENGTH"
)

const (
	// exDataErr and exTempFail are sysexits.h's EX_DATAERR and EX_TEMPFAIL.
	exDataErr  = 65
	exTempFail = 75

	// execDirectiveMax is the longest stdout line read as a directive;
	// other output is ignored without being kept.
	execDirectiveMax = 256
	// execStderrKeep is how much of the end of stderr is kept.
	execStderrKeep = 4 << 10
	// execStderrLines and execStderrBytes bound the stderr excerpt in a
	// failure's error.
	execStderrLines = 5
	execStderrBytes = 512
	// execWaitDelay bounds the wait for the command's output to close
	// after it exited or was killed: a process it left running in the
	// background may hold it open.
	execWaitDelay = time.Second
)

// execHandler runs a command per record: cfg.Command as argv, without a
// shell, the payload on stdin, the delivery's metadata and headers in the
// environment (after the daemon's environment and the configured env,
// which the metadata variables override). When two header names map to
// one variable, the later header in the record wins.
//
// The command runs in a process group of its own. When the timeout passes
// or the handler's ctx ends (shutdown), the whole group is killed with
// SIGKILL, so nothing it started outlives it.
//
// The outcome:
//
//	directive line on stdout             what it names (an invalid one: failed)
//	exit status 0                        ack
//	exit status 65 (EX_DATAERR)          drop
//	exit status 75 (EX_TEMPFAIL)         failed
//	any other status, a signal           failed
//	the program cannot be started        failed
//	timeout, ctx ended                   failed ("timed out after ...", "cancelled")
//
// A directive is a stdout line (at most 256 bytes, spaces, tabs and CR
// around it ignored) of the form retry_after=<duration>, or
// outcome=<directive> with ack, drop, retry or retry_after=<duration> (see
// parseOutcomeDirective). It wins over the exit status, and the last one
// printed counts; other stdout lines are ignored. Failed carries the exit
// status and the last lines of stderr; the settlement turns it into
// retry_after(the next backoff step).
type execHandler struct {
	path    string   // the program, found in $PATH at construction
	args    []string // argv, as configured
	env     []string // the daemon's environment and the configured env
	timeout time.Duration
	logger  *slog.Logger

	logMu     sync.Mutex
	lingerLog ratelog.Limiter // under logMu
}

func newExecHandler(cfg conf.Handler, logger *slog.Logger) (*execHandler, error) {
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, errors.New("command: must name the program")
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return nil, fmt.Errorf("command: %w", err)
	}
	env := os.Environ()
	for _, name := range slices.Sorted(maps.Keys(cfg.Env)) {
		env = append(env, name+"="+cfg.Env[name])
	}
	return &execHandler{
		path:    path,
		args:    slices.Clone(cfg.Command),
		env:     env,
		timeout: time.Duration(cmp.Or(cfg.Timeout, conf.DefaultExecTimeout)),
		logger:  logger,
	}, nil
}

// Handle runs the command for d and maps how it ended to an outcome.
func (h *execHandler) Handle(ctx context.Context, d *Delivery) Outcome {
	rctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var stdout execDirectives
	var stderr tailBuffer
	cmd := exec.CommandContext(rctx, h.path)
	cmd.Args = h.args
	cmd.Env = h.environ(d)
	cmd.Stdin = bytes.NewReader(d.Payload)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// The command dies with the daemon: a kill -9 of the daemon must not
	// leave it reading a payload cut short. The kernel sends Pdeathsig
	// when the thread that forked the child ends, not the process
	// (go.dev/issue/27505), so this goroutine keeps its thread, and no
	// other goroutine may end it, until the command has exited.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = execWaitDelay
	err := cmd.Run()
	stdout.finish()

	prog := h.args[0]
	st := cmd.ProcessState
	exited := st != nil && st.Exited()
	switch {
	case !exited && ctx.Err() != nil:
		return Failed(FailureCanceled, fmt.Errorf("exec %s: cancelled: %w", prog, context.Cause(ctx)))
	case !exited && rctx.Err() != nil:
		return Failed(FailureTimeout, fmt.Errorf("exec %s: timed out after %s", prog, h.timeout))
	case st == nil:
		return Failed(FailureExecStart, fmt.Errorf("exec %s: %w", prog, err))
	case !exited:
		return Failed(FailureExecSignal, fmt.Errorf("exec %s: %s%s", prog, st, stderr.excerpt()))
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		h.warnLingering(prog)
	}
	switch {
	case stdout.err != nil:
		return Failed(FailureOther, fmt.Errorf("exec %s: stdout: %w", prog, stdout.err))
	case stdout.named:
		return stdout.outcome
	}
	switch code := st.ExitCode(); code {
	case 0:
		return Outcome{Kind: OutcomeAck}
	case exDataErr:
		return Outcome{Kind: OutcomeDrop}
	case exTempFail:
		return Failed(FailureTempFail, fmt.Errorf("exec %s: exit status %d (EX_TEMPFAIL)%s", prog, code, stderr.excerpt()))
	default:
		return Failed(FailureExecStatus, fmt.Errorf("exec %s: exit status %d%s", prog, code, stderr.excerpt()))
	}
}

// environ is the command's environment for d.
func (h *execHandler) environ(d *Delivery) []string {
	env := make([]string, 0, len(h.env)+len(d.Headers)+len(deliveryMeta))
	env = append(env, h.env...)
	for _, e := range d.Headers {
		if utf8.Valid(e.Value) && bytes.IndexByte(e.Value, 0) < 0 {
			env = append(env, execHeaderEnvPrefix+envName(e.Name)+"="+string(e.Value))
		} else {
			env = append(env, execBase64HeaderEnvPrefix+envName(e.Name)+"="+base64Value(e.Value))
		}
	}
	var b []byte
	for _, m := range deliveryMeta {
		b = append(append(b[:0], m.env...), '=')
		env = append(env, string(m.appendValue(b, d)))
	}
	// A command killed or cut off mid-read can tell a short payload.
	env = append(env, string(strconv.AppendInt([]byte(execPayloadLengthEnv+"="), int64(len(d.Payload)), 10)))
	return env
}

// envName writes a header name as a variable name: upper case, each byte
// other than A-Z and 0-9 replaced by '_'.
func envName(name string) string {
	b := []byte(name)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - ('a' - 'A')
		case 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

// warnLingering logs, at most once per ratelog.Every, that a command exited
// while something it started kept its output open.
func (h *execHandler) warnLingering(prog string) {
	h.logMu.Lock()
	ok, suppressed := h.lingerLog.Allow(time.Now())
	h.logMu.Unlock()
	if ok {
		h.logger.Warn("command exited but a process it started kept stdout or stderr open; each record waits for it",
			"program", prog, "wait", execWaitDelay, "suppressed", suppressed)
	}
}

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
