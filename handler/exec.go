package handler

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/internal/ratelog"
)

const (
	// exDataErr and exTempFail are sysexits.h's EX_DATAERR and EX_TEMPFAIL.
	exDataErr  = 65
	exTempFail = 75

	// execWaitDelay bounds the wait for the command's output to close
	// after it exited or was killed: a process it left running in the
	// background may hold it open.
	execWaitDelay = time.Second
)

// execHandler runs a command per record: cfg.Command as argv, without a
// shell, the payload on stdin, the delivery's metadata and headers in the
// environment (after the daemon's environment and the configured env,
// which the metadata variables override), with the payload's length in
// STREAMD_PAYLOAD_LENGTH. When two header names map to one variable, the
// later header in the record wins. The daemon's own STREAMD_HEADER_* and
// STREAMD_BASE64_HEADER_* variables, a record's of an outer streamd that
// runs this one, are not passed on (see execBaseEnv).
//
// The command runs in a process group of its own. When the timeout passes
// or the handler's ctx ends (shutdown), the whole group is killed with
// SIGKILL, so nothing it started outlives it; when the daemon dies, even
// by kill -9, the kernel kills the command (Pdeathsig, see runGroup).
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
// parseOutcomeDirective). It wins over the exit status (not over a signal
// or the timeout: a command cut short may not have meant it), and the last
// one printed counts; other stdout lines are ignored. Failed carries the exit
// status and the last lines of stderr; the delivery is held in place and
// made again after the next backoff step.
type execHandler struct {
	path    string   // the program, found in $PATH at construction
	args    []string // argv, as configured
	env     []string // the daemon's environment and the configured env
	timeout time.Duration
	logger  *slog.Logger

	lingerLog ratelog.Line
}

func newExecHandler(cfg conf.Handler, logger *slog.Logger) (*execHandler, error) {
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, optionErrorf("command", "must name the program")
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return nil, optionErrorf("command", "%w", err)
	}
	return &execHandler{
		path:    path,
		args:    slices.Clone(cfg.Command),
		env:     execBaseEnv(cfg.Env),
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
	cmd.WaitDelay = execWaitDelay
	err := runGroup(cmd)
	stdout.finish()

	prog := h.args[0]
	st := cmd.ProcessState
	exited := st != nil && st.Exited()
	switch {
	case !exited && ctx.Err() != nil:
		return Failed(FailureCanceled, fmt.Errorf("exec %s: cancelled: %w", prog, context.Cause(ctx)))
	case !exited && rctx.Err() != nil:
		return Failed(FailureTimeout, fmt.Errorf("exec %s: timed out after %s", prog, h.timeout))
	case st == nil && errors.Is(err, syscall.E2BIG):
		if name, size, ok := recordTooLarge(cmd.Args, cmd.Env, len(h.env)); ok {
			// No later try can pass it: held, it would hold the
			// subscription for good.
			h.logger.Error("dropping a record whose headers do not fit in the command's environment (Linux takes at most 128 KiB a variable, and all of them with the arguments within a quarter of the stack limit): pass such records to a command by another handler",
				"seq", d.Seq, "largest_variable", name, "largest_bytes", size, "err", err)
			return Outcome{Kind: OutcomeDrop}
		}
		return Failed(FailureExecStart, fmt.Errorf("exec %s: the arguments and the environment are too large (the env table, or what the daemon inherited): %w", prog, err))
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

// warnLingering logs, at most once per ratelog.Every, that a command exited
// while something it started kept its output open.
func (h *execHandler) warnLingering(prog string) {
	h.lingerLog.Warn(h.logger, "command exited but a process it started kept stdout or stderr open; each record waits for it",
		"program", prog, "wait", execWaitDelay)
}
