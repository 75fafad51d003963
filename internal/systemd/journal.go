package systemd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
)

// NewJournalHandler returns a handler that writes text records to w, the
// journal's stream, without the time (journald stamps each line) and
// without the level: a "<N>" priority prefix, which journald turns into
// PRIORITY, says it (error 3, warning 4, info 6, debug 7). The ReplaceAttr
// of opts, if any, sees every other attribute.
func NewJournalHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	o := *opts
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
			return slog.Attr{}
		}
		if opts.ReplaceAttr != nil {
			return opts.ReplaceAttr(groups, a)
		}
		return a
	}
	jh := &journalHandler{shared: &journalShared{w: w}}
	jh.inner = slog.NewTextHandler(&jh.shared.buf, &o)
	return jh
}

// IsJournalStream reports whether f is the stream systemd connected to the
// journal, as go-systemd's StderrIsJournalStream decides it.
func IsJournalStream(f *os.File) bool {
	dev, ino, ok := strings.Cut(os.Getenv("JOURNAL_STREAM"), ":")
	if !ok {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return fmt.Sprint(st.Dev) == dev && fmt.Sprint(st.Ino) == ino
}

// journalHandler formats each record with a text handler into a buffer and
// writes it with its syslog priority prefix: error 3, warning 4, info 6,
// debug 7.
type journalHandler struct {
	inner  slog.Handler // writes into shared.buf
	shared *journalShared
}

type journalShared struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   io.Writer
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	s := h.shared
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
	s.buf.WriteString(priority(r.Level))
	if err := h.inner.Handle(ctx, r); err != nil {
		return err
	}
	_, err := s.w.Write(s.buf.Bytes())
	return err
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &journalHandler{inner: h.inner.WithAttrs(as), shared: h.shared}
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	return &journalHandler{inner: h.inner.WithGroup(name), shared: h.shared}
}

func priority(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "<3>"
	case l >= slog.LevelWarn:
		return "<4>"
	case l >= slog.LevelInfo:
		return "<6>"
	}
	return "<7>"
}
