package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/streamd/streamd/internal/ratelog"
)

const (
	// shutdownTimeout bounds how long Run waits for requests in flight
	// once its context is done.
	shutdownTimeout = 5 * time.Second
	// readHeaderTimeout bounds how long a client may take to send its
	// request headers.
	readHeaderTimeout = 10 * time.Second
)

// Server is the HTTP listener of /metrics and /healthz:
//
//	GET /metrics   the exposition of the gatherer, in the Prometheus text format
//	GET /healthz   200 "ok" while the daemon has no problem and every subscription is healthy, else 503
//	               with one line per unhealthy subscription ([Health.Err])
//
// With a web configuration file (the format of Prometheus' exporter
// toolkit, as node_exporter's --web.config.file: tls_server_config,
// basic_auth_users with bcrypt hashes, http_server_config), both paths are
// served over TLS and behind basic auth as the file says; the file is read
// again for each connection, so a new certificate or user needs no restart.
//
// [Server.Listen] binds the address and checks the web configuration, so
// that a bad address or file fails before the daemon reports that it is
// ready; [Server.Run] serves until its context is done. Listen, Run and
// Close are called from one goroutine.
type Server struct {
	listen    string
	webConfig string
	handler   http.Handler
	logger    *slog.Logger
	ln        net.Listener
}

// NewServer returns a server for the host:port listen that serves reg and
// health, secured as the web configuration file webConfig says ("" for
// plain HTTP without authentication); it starts nothing. A nil health is
// always healthy, a nil logger discards.
func NewServer(listen, webConfig string, reg prometheus.Gatherer, health *Health, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "metrics")
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      errorLog{logger},
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.Handle("GET /healthz", healthHandler(health))
	return &Server{listen: listen, webConfig: webConfig, handler: mux, logger: logger}
}

// healthHandler serves /healthz.
func healthHandler(h *Health) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := h.Err(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, err.Error()+"\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
}

// errorLog logs the errors of gathering and serving metrics.
type errorLog struct{ logger *slog.Logger }

func (l errorLog) Println(v ...any) {
	l.logger.Error("serving metrics failed", "err", fmt.Sprint(v...))
}

// connLog is the HTTP server's error log, at WARN. Its lines of failed TLS
// handshakes, which a port scan or a scrape of https with http makes, come
// at most one every 10 s with the count of those left out, so that a
// scanner cannot flood the daemon's log; the others (a panic, an accept
// error) all come.
type connLog struct {
	logger    *slog.Logger
	handshake ratelog.Line
}

func (l *connLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if strings.Contains(msg, "TLS handshake error") {
		l.handshake.Warn(l.logger, "a metrics connection failed its TLS handshake", "err", msg)
	} else {
		l.logger.Warn(msg)
	}
	return len(p), nil
}

// Listen checks the web configuration file and binds the listen address.
// The error names the file or the address, such as "metrics: listen on
// 127.0.0.1:9464: address already in use", and matches the system error
// with [errors.Is].
func (s *Server) Listen() error {
	if s.ln != nil {
		return fmt.Errorf("metrics: listen on %s: already listening", s.listen)
	}
	if err := CheckWebConfig(s.webConfig); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		var opErr *net.OpError
		if errors.As(err, &opErr) {
			err = opErr.Err
		}
		var sysErr *os.SyscallError
		if errors.As(err, &sysErr) {
			err = sysErr.Err
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("metrics: listen on %s: %w: another process (another streamd?) listens there; stop it, or set another address in [metrics] listen", s.listen, err)
		}
		return fmt.Errorf("metrics: listen on %s: %w", s.listen, err)
	}
	s.ln = ln
	return nil
}

// Addr returns the address the server listens on, with the port the
// system chose for port 0, or "" before [Server.Listen].
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Run serves on the listener, calling [Server.Listen] first if it was not
// called, until ctx is done. It then stops accepting, lets requests in
// flight finish for up to 5 s, and returns nil. It returns an error if the
// listener cannot be bound or fails, or if requests were still in flight
// after those 5 s (they are cut off). Run is called once, and closes the
// listener when it returns.
func (s *Server) Run(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	addr := s.Addr()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog:          log.New(&connLog{logger: s.logger}, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- s.serve(srv) }()

	select {
	case err := <-served:
		return errors.Join(fmt.Errorf("metrics: serve on %s: %w", addr, err), srv.Close())
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		err = fmt.Errorf("metrics: shut down %s: %w", addr, errors.Join(err, srv.Close()))
	}
	<-served // http.ErrServerClosed
	return err
}

// CheckWebConfig reads the web configuration file at path, its
// certificates and keys, as [Server.Listen] does; "" is none and always
// valid. The error names the file.
func CheckWebConfig(path string) error {
	if path == "" {
		return nil
	}
	if err := web.Validate(path); err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) && pathErr.Path == path {
			err = pathErr.Err
		}
		if strings.HasPrefix(err.Error(), "crypto/bcrypt: ") {
			// The toolkit names neither the key nor the user.
			return fmt.Errorf("metrics: web config file %s: basic_auth_users: %w: each user's value is a bcrypt hash of the password, "+
				"as htpasswd -nbBC 10 \"\" PASSWORD | tr -d ':\\n' prints it, never the password itself", path, err)
		}
		return fmt.Errorf("metrics: web config file %s: %w", path, err)
	}
	return nil
}

// serve serves srv on the listener: through the exporter toolkit, which
// logs the address and whether TLS is on, with a web configuration file;
// else plainly.
func (s *Server) serve(srv *http.Server) error {
	if s.webConfig == "" {
		s.logger.Info("listening", "address", s.Addr(), "tls", false)
		return srv.Serve(s.ln)
	}
	return web.Serve(s.ln, srv, &web.FlagConfig{WebConfigFile: &s.webConfig}, s.logger)
}

// Close closes the listener of a server that [Server.Listen] bound but
// that will not [Server.Run], such as when startup fails after Listen. It
// does nothing after Run.
func (s *Server) Close() error {
	if s.ln == nil {
		return nil
	}
	if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("metrics: close %s: %w", s.listen, err)
	}
	return nil
}
