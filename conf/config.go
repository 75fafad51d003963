package conf

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/streamd/streamd/tail"

	"github.com/BurntSushi/toml"
	"github.com/streamd/streamd/streamfile"
)

// Mode says which command a configuration is for. Some keys only mean
// something to one of them, and setting them for the other is an error.
type Mode int

const (
	// ModeRun, the zero Mode, is the daemon, streamd run: subscriptions
	// read [[stream]] files and positions are kept in state_dir.
	ModeRun Mode = iota
	// ModePipe is one stage of a shell pipeline, streamd pipe:
	// subscriptions read stdin, copies leave on stdout, nothing is stored.
	ModePipe
)

// String returns the command of the mode: "run" or "pipe".
func (m Mode) String() string {
	if m == ModePipe {
		return "pipe"
	}
	return "run"
}

// UnmarshalText reads a mode by the name of its command, run or pipe, as
// a command-line value.
func (m *Mode) UnmarshalText(text []byte) error {
	switch string(text) {
	case "run":
		*m = ModeRun
	case "pipe":
		*m = ModePipe
	default:
		return fmt.Errorf("unknown mode %q: use run or pipe", text)
	}
	return nil
}

// MarshalText writes the mode as [Mode.String] does.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Config is a streamd configuration file. [Load] returns it checked,
// with relative paths made absolute and defaults filled in.
type Config struct {
	// StateDir holds the offsets sidecar and the retry spool (ModeRun).
	// Default: $STATE_DIRECTORY (its first entry), as systemd sets it.
	StateDir string `toml:"state_dir"`
	// ShutdownTimeout bounds a graceful stop. Default 20s.
	ShutdownTimeout Duration `toml:"shutdown_timeout"`
	// CommitInterval is how often positions are committed (ModeRun).
	// Default 1s.
	CommitInterval Duration `toml:"commit_interval"`
	// MaxDelayedMiB bounds the memory, in MiB, that copies delayed by a
	// retry_after hold in a pipe stage (ModePipe), which keeps them in
	// memory; at the bound the stage stops reading stdin until copies
	// leave. Default 256.
	MaxDelayedMiB int `toml:"max_delayed_mib"`

	Log     Log     `toml:"log"`
	Metrics Metrics `toml:"metrics"`

	Streams       []Stream       `toml:"stream"`
	Subscriptions []Subscription `toml:"subscription"`

	// keys is where the file loaded writes each key, for [Config.HandlerPlace];
	// nil for a Config not loaded from a file.
	keys *keyPlaces
}

// keyPlaces is where a configuration file writes its keys.
type keyPlaces struct {
	file  string
	lines lineMap
}

// HandlerPlace returns where the configuration file writes option of the
// named subscription's handler table, for a message about its value that
// is found wrong only once the handler is built (a file it reads, a server
// it reaches), as "path:line", like [Load]'s messages: the line of the
// handler table when the option is "" or not written, the path alone when
// no line is known, "" for a Config not loaded from a file.
func (c *Config) HandlerPlace(subscription, option string) string {
	if c.keys == nil {
		return ""
	}
	i := slices.IndexFunc(c.Subscriptions, func(s Subscription) bool { return s.Name == subscription })
	if i < 0 {
		return c.keys.file
	}
	p := keyPath{}.k("subscription").i(i).k("handler")
	if option != "" {
		p = p.k(option)
	}
	if line := c.keys.lines.line(p); line > 0 {
		return fmt.Sprintf("%s:%d", c.keys.file, line)
	}
	return c.keys.file
}

// Place returns where the configuration file writes the key at the path
// keys ("state_dir"; "metrics", "listen"), as "path:line", like [Load]'s
// messages, for a message about its value that is found wrong only on
// this machine (a host name that does not resolve): the line of the table holding
// the key when the file does not write it, "" when it writes neither (the
// value came from the environment or is a default) or for a Config not
// loaded from a file.
func (c *Config) Place(keys ...string) string {
	if c.keys == nil {
		return ""
	}
	p := keyPath{}
	for _, k := range keys {
		p = p.k(k)
	}
	if line := c.keys.lines.line(p); line > 0 {
		return fmt.Sprintf("%s:%d", c.keys.file, line)
	}
	return ""
}

// Log is the [log] table.
type Log struct {
	// Level is debug, info (default), warn or error.
	Level string `toml:"level"`
	// Format is auto (default: journald's form under journald, else text),
	// text or json.
	Format string `toml:"format"`
}

// Metrics is the [metrics] table.
type Metrics struct {
	// Listen is the host:port of the /metrics listener, "" for none.
	// Default 127.0.0.1:9464 for ModeRun, none for ModePipe.
	Listen string `toml:"listen"`
	// WebConfigFile is the path of a web configuration file that puts TLS
	// and basic auth on the listener (the format of node_exporter's
	// --web.config.file), "" for plain HTTP.
	WebConfigFile string `toml:"web_config_file"`
}

// Stream is one [[stream]]: a stream file (ModeRun only).
type Stream struct {
	// Name is what subscriptions and metrics call the stream.
	Name string `toml:"name"`
	// Path is the stream file.
	Path string `toml:"path"`
	// Create allows creating a missing file. Without it (the reference's
	// existing_only) a missing file holds back the stream's subscriptions,
	// reported unhealthy, until it appears. Default true.
	Create bool `toml:"create"`
	// BeaconInterval is the beacon interval of a file streamd creates, a
	// positive multiple of 1024. Default 1048576.
	BeaconInterval int `toml:"beacon_interval"`
	// PollInterval is how often the file is checked for growth even when
	// no file notification came. Default 1s.
	PollInterval Duration `toml:"poll_interval"`
	// FileMode is the permission bits of the file when streamd creates it,
	// set whatever the umask; the group is the process's, or the
	// directory's when it is setgid. Default 0640.
	FileMode FileMode `toml:"file_mode"`
	// RotationGrace is how long a file renamed away from the path (or no
	// longer a symlink's target) must stay quiet before its readers leave
	// it for the new file: a producer may still write to the old one.
	// Default 5s.
	RotationGrace Duration `toml:"rotation_grace"`
}

// Subscription is one [[subscription]]: a handler on a stream key.
type Subscription struct {
	// Name identifies the subscription in the sidecar, metrics, logs and
	// the x-streamd-origin header of its copies.
	Name string `toml:"name"`
	// RenamedFrom lists names the subscription had before: its retry
	// copies made under them (x-streamd-origin) are its own, not passed
	// over as another subscription's.
	RenamedFrom []string `toml:"renamed_from"`
	// Stream is the name of the [[stream]] read (ModeRun only).
	Stream string `toml:"stream"`
	// Key is the stream key read.
	Key string `toml:"key"`
	// StartAt is where the first start reads from (ModeRun only); later
	// starts resume at the stored position. Default beginning.
	StartAt tail.Start `toml:"start_at"`
	// Replay makes the subscription finish at the end of the file or its
	// end-of-stream mark (ModeRun only).
	Replay bool `toml:"replay"`
	// Concurrency is how many records are handled at once, 1 to 1024.
	// Default 1.
	Concurrency int `toml:"concurrency"`
	// MaxAttempts caps deliveries of a record, counting the first; nil is
	// no cap.
	MaxAttempts *int `toml:"max_attempts"`
	// DeadLetter is the stream key a record goes to at the cap, or on its
	// first retry when there is no cap; "" is none.
	DeadLetter string `toml:"dead_letter"`
	// OutRetry is the stream key retry copies go to; "" is Key. A pipe
	// stage must name one.
	OutRetry string `toml:"out_retry"`
	// Backoff is the delay before each delivery of a record again after
	// its delivery failed (the handler could not decide: a timeout, a
	// connection error, a 5xx, exit status 75), and before each try again
	// to write a copy that could not be written; the last step repeats.
	// Default 1s, 5s, 30s, 2m.
	Backoff []Duration `toml:"backoff"`
	// MaxFailedDeliveries bounds the failed deliveries of one record in a
	// row: at the bound the record is settled as a retry (max_attempts and
	// dead_letter apply). 0, the default, holds the record until the
	// handler answers, however long it fails.
	MaxFailedDeliveries int `toml:"max_failed_deliveries"`
	// MaxRetryAfter bounds the delay a handler asks for: a retry_after
	// answer's, and a failed delivery's Retry-After. A longer one is cut
	// to it, and logged. Default 24h, at most ten years.
	MaxRetryAfter Duration `toml:"max_retry_after"`
	// LogUnsupported is "first" (default: log an unsupported
	// acknowledgement once per outcome, then count it), "every" (log each,
	// as the reference does) or "off" (log none, count each).
	LogUnsupported string `toml:"log_unsupported"`
	// OnCorrupt is what a checksum error does (ModeRun only): "skip"
	// (default: skip the frame) or "stop" (stop the subscription).
	OnCorrupt string `toml:"on_corrupt"`
	// OnInvalid is what an invalid stdin line does (ModePipe only): "skip"
	// (default: count and log it) or "fail" (end the stage with an error).
	OnInvalid string `toml:"on_invalid"`

	Handler Handler `toml:"handler"`
}

// The handler kinds.
const (
	HandlerHTTP    = "http"    // POST each record to a URL
	HandlerExec    = "exec"    // run a command per record, payload on stdin
	HandlerStdout  = "stdout"  // print each record (ModeRun only: a pipe's stdout carries data)
	HandlerDiscard = "discard" // acknowledge each record and do nothing
	HandlerNATS    = "nats"    // publish each record into a NATS JetStream stream
)

// Handler is a subscription's [subscription.handler] table. Which
// options apply depends on Kind; setting another kind's option is an error.
type Handler struct {
	// Kind is http, exec, stdout, discard or nats.
	Kind string `toml:"kind"`

	// URL is where http POSTs: http:// or https://, without credentials.
	// For nats, the server or servers to connect to, comma-separated:
	// nats://, tls://, ws:// or wss://, without credentials.
	URL string `toml:"url"`
	// Timeout bounds one delivery (http, exec and nats). Default 5s for
	// http and nats, 30s for exec.
	Timeout Duration `toml:"timeout"`
	// Headers are added to each http request. Authorization is not allowed
	// here: the configuration holds no secrets.
	Headers map[string]string `toml:"headers"`
	// BearerTokenFile holds the token sent as Authorization: Bearer (http).
	BearerTokenFile string `toml:"bearer_token_file"`
	// CAFile holds the PEM certificates that verify an https server (or
	// a NATS server over TLS), instead of the system's.
	CAFile string `toml:"ca_file"`

	// BatchMaxRecords turns on batches (http, nats): up to this many
	// records, 1 to MaxBatchRecords, go in one request, one NDJSON line
	// each (http), or are published at once before their
	// acknowledgements are awaited (nats); the subscription's concurrency
	// counts batches in flight. 0, the default, hands the handler one
	// record at a time.
	BatchMaxRecords int `toml:"batch_max_records"`
	// BatchMaxBytes bounds a batch by the payload and header bytes of its
	// records, before they are written as NDJSON (base64 makes the body
	// about a third larger): a record that would take a batch past it
	// starts the next one, and a larger record goes alone. Default
	// DefaultBatchMaxBytes, with batch_max_records.
	BatchMaxBytes int `toml:"batch_max_bytes"`
	// BatchLinger is how long a batch that is not full waits for more
	// records after its first, before it is sent. Default
	// DefaultBatchLinger, with batch_max_records.
	BatchLinger Duration `toml:"batch_linger"`

	// Subject is where nats publishes: a NATS subject in which {key} is
	// replaced by the stream key, as in "orders.{key}". Load replaces it
	// (a subscription reads one key); a configuration built in Go must.
	Subject string `toml:"subject"`
	// CredsFile is a NATS credentials file (a user JWT and its seed).
	CredsFile string `toml:"creds_file"`
	// NkeyFile holds a NATS user's nkey seed.
	NkeyFile string `toml:"nkey_file"`
	// User and PasswordFile are a NATS user and the file holding its
	// password.
	User         string `toml:"user"`
	PasswordFile string `toml:"password_file"`
	// CertFile and KeyFile are the client certificate and its key that
	// nats presents to a server that asks for one.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`

	// Command is the argv exec runs: a program found in $PATH, or a path.
	Command []string `toml:"command"`
	// Env is added to the environment of exec's command.
	Env map[string]string `toml:"env"`

	// Format is how stdout prints a record: log (default: a stdio line) or
	// ndjson (the schema of streamd decode --format=ndjson).
	Format string `toml:"format"`
}

// handlerKinds lists the kinds with their options, in the order messages
// name them.
var handlerKinds = []struct {
	kind    string
	options []string
}{
	{HandlerHTTP, []string{"url", "timeout", "headers", "bearer_token_file", "ca_file", "batch_max_records", "batch_max_bytes", "batch_linger"}},
	{HandlerExec, []string{"command", "timeout", "env"}},
	{HandlerStdout, []string{"format"}},
	{HandlerDiscard, nil},
	{HandlerNATS, []string{"url", "subject", "timeout", "creds_file", "nkey_file", "user", "password_file", "ca_file", "cert_file", "key_file", "batch_max_records", "batch_max_bytes", "batch_linger"}},
}

// Defaults.
const (
	defaultShutdownTimeout = Duration(20 * time.Second)
	defaultCommitInterval  = Duration(time.Second)
	defaultPollInterval    = Duration(time.Second)
	defaultFileMode        = FileMode(0o640)
	defaultRotationGrace   = Duration(tail.DefaultRotationGrace)
	defaultListen          = "127.0.0.1:9464"
	defaultMaxDelayedMiB   = 256
)

// maxDelayedMiB is the largest max_delayed_mib: more than a machine holds
// (1 PiB), and in bytes far from overflowing.
const maxDelayedMiB = 1 << 30

// DefaultMaxRetryAfter is the default max_retry_after, which the daemon
// also applies to a configuration built in Go without it.
const DefaultMaxRetryAfter = Duration(24 * time.Hour)

// The default handler timeouts, which the handlers also apply to a
// configuration built in Go without them.
const (
	DefaultHTTPTimeout = Duration(5 * time.Second)
	DefaultExecTimeout = Duration(30 * time.Second)
	DefaultNATSTimeout = Duration(5 * time.Second)
)

// The defaults of a batch's bounds, which the daemon also applies to a
// configuration built in Go that sets BatchMaxRecords without them, and the
// largest bounds a configuration may set (the daemon holds up to
// concurrency + 2 batches of a subscription in memory).
const (
	DefaultBatchMaxBytes = 512 << 10
	DefaultBatchLinger   = Duration(100 * time.Millisecond)
	MaxBatchRecords      = 10_000
	MaxBatchBytes        = 256 << 20
)

func defaultBackoff() []Duration {
	return []Duration{Duration(time.Second), Duration(5 * time.Second), Duration(30 * time.Second), Duration(2 * time.Minute)}
}

// DefaultFile is the configuration file used when none is named:
// streamd.toml in $CONFIGURATION_DIRECTORY (its first entry) when systemd
// sets it, else /etc/streamd/streamd.toml.
func DefaultFile() string {
	if dir := firstEntry(os.Getenv("CONFIGURATION_DIRECTORY")); dir != "" {
		return filepath.Join(dir, "streamd.toml")
	}
	return "/etc/streamd/streamd.toml"
}

// firstEntry returns the first directory of a colon-separated list, as
// systemd sets $STATE_DIRECTORY and $CONFIGURATION_DIRECTORY.
func firstEntry(list string) string {
	dir, _, _ := strings.Cut(list, ":")
	return dir
}

// StateDir returns the state directory the configuration file at path
// names (state_dir, or $STATE_DIRECTORY), resolved as [Load] resolves it,
// reading that key alone: a file that Load refuses for another reason
// still names the daemon that would refuse it, which `streamd reload` asks
// all the same, so that the daemon's refusal is logged and counted.
func StateDir(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var tree map[string]any // keys as written: Load refuses State_Dir
	if _, err := toml.Decode(string(data), &tree); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	v, set := tree["state_dir"]
	dir, _ := v.(string)
	switch {
	case dir != "" && filepath.IsAbs(dir):
		return filepath.Clean(dir), nil
	case dir != "" && !strings.HasPrefix(dir, "~"):
		return filepath.Abs(filepath.Join(filepath.Dir(path), dir))
	case !set && filepath.IsAbs(firstEntry(os.Getenv("STATE_DIRECTORY"))):
		return firstEntry(os.Getenv("STATE_DIRECTORY")), nil
	}
	return "", fmt.Errorf("%s: no state_dir (nor $STATE_DIRECTORY)", path)
}

// Load reads the configuration file at path for mode, checks it, and
// returns it with defaults filled in. Relative paths in the file are taken
// from the file's directory.
//
// Every problem is reported, joined in one error, one per line in file
// order, each written "path:line: key: problem", as in
//
//	streamd.toml:14: subscription[1].key: stream key "a b" has character ' ' at byte 1; allowed are A-Z a-z 0-9 . _ -
//
// (without ":line" for a key that is not in the file). Unknown keys,
// misspelt ones (keys are case-sensitive) and values of the wrong type are
// reported first; the other checks need a well-typed file. A TOML syntax
// error is one error, written "path:line:column: problem", that wraps a
// [toml.ParseError]; [Detail] adds the lines around it.
//
// Load reads path and $STATE_DIRECTORY, and writes nothing.
func Load(path string, mode Mode) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("configuration file %s: %w", path, err)
	}
	return parse(path, dir, string(data), mode)
}

// parse is [Load] on the contents src of the file named file in
// the directory dir.
func parse(file, dir, src string, mode Mode) (*Config, error) {
	var tree map[string]any
	md, err := toml.Decode(src, &tree)
	if err != nil {
		if pe, ok := errors.AsType[toml.ParseError](err); ok {
			pe.Position.Line, pe.Position.Col = lineCol(src, pe.Position.Start)
			return nil, &syntaxError{file: file, err: pe}
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	l := &loader{file: file, dir: dir, mode: mode, tree: tree, lines: newLineMap(src, &md, tree)}
	// BurntSushi/toml matches keys case-insensitively and ignores unknown
	// ones, and its type errors stop at the first: check first that every
	// key is a field's exact tag and every value has the field's type.
	l.checkTypes(tree, configType, nil)
	if err := l.err(); err != nil {
		return nil, err
	}
	cfg := new(Config)
	if _, err := toml.Decode(src, cfg); err != nil { // checkTypes lets through only what decodes
		return nil, fmt.Errorf("%s: decode after checking types: %w", file, err)
	}
	l.validate(cfg)
	if err := l.err(); err != nil {
		return nil, err
	}
	l.setDefaults(cfg)
	cfg.keys = &keyPlaces{file: file, lines: l.lines}
	return cfg, nil
}

// syntaxError is a TOML syntax error in a configuration file.
type syntaxError struct {
	file string
	err  toml.ParseError
}

func (e *syntaxError) Error() string {
	p := e.err.Position
	msg := oneLine.Replace(e.err.Message)
	if strings.Contains(msg, "cannot have leading zeroes") {
		msg += `: if it is a file mode, write it as a string, as in file_mode = "0660"`
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.file, p.Line, p.Col, msg)
}

// lineCol returns the line and column, from 1, of the byte at offset in
// src. The TOML decoder's own line is one too far when the error is at a
// line's newline, and its column is wrong at a line's start; its byte
// offset is right.
func lineCol(src string, offset int) (line, col int) {
	offset = min(max(offset, 0), len(src))
	before := src[:offset]
	return 1 + strings.Count(before, "\n"), offset - strings.LastIndexByte(before, '\n')
}

// oneLine escapes line breaks that a message quotes from the file, so that
// each problem stays on one line.
var oneLine = strings.NewReplacer("\n", `\n`, "\r", `\r`)

func (e *syntaxError) Unwrap() error { return e.err }

// Detail returns what check-config shows of an error [Load] returned: for
// a TOML syntax error, its "path:line:column: problem" line, as every other
// problem is written, then the lines around the place with a caret under
// it, since a syntax error's one line rarely says enough; for any other
// error, its message, which already names each problem's file, line and
// key.
func Detail(err error) string {
	se, ok := errors.AsType[*syntaxError](err)
	if !ok {
		return err.Error()
	}
	// The decoder's excerpt starts with its own message and position,
	// "toml: error: ...\n\nAt line 2, column 13:\n\n", which the first
	// line already says.
	_, rest, found := strings.Cut(se.err.ErrorWithPosition(), "\n\nAt line ")
	if _, excerpt, ok := strings.Cut(rest, ":\n\n"); found && ok {
		return se.Error() + "\n\n" + strings.TrimRight(excerpt, "\n")
	}
	return se.Error()
}

// loader checks one configuration file and collects its problems.
type loader struct {
	file  string
	dir   string // absolute directory of file, for relative paths
	mode  Mode
	tree  map[string]any // the file decoded without a schema
	lines lineMap
	errs  []*keyError
}

// keyError is one problem of a configuration file, at a key.
type keyError struct {
	file string
	line int // 0 when not known
	key  string
	msg  string
}

func (e *keyError) Error() string {
	if e.line == 0 {
		return fmt.Sprintf("%s: %s: %s", e.file, e.key, e.msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.file, e.line, e.key, e.msg)
}

func (l *loader) errorf(p keyPath, format string, args ...any) {
	l.errs = append(l.errs, &keyError{file: l.file, line: l.lines.line(p), key: p.String(), msg: fmt.Sprintf(format, args...)})
}

// err returns the problems found, in file order, or nil.
func (l *loader) err() error {
	if len(l.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(l.errs, func(a, b *keyError) int {
		return cmp.Or(cmp.Compare(a.line, b.line), strings.Compare(a.key, b.key))
	})
	errs := make([]error, len(l.errs))
	for i, e := range l.errs {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// has reports whether the file sets the value at p.
func (l *loader) has(p keyPath) bool {
	_, ok := l.lookup(p)
	return ok
}

// lookup returns the value the file sets at p.
func (l *loader) lookup(p keyPath) (any, bool) {
	var v any = l.tree
	for _, e := range p {
		switch x := v.(type) {
		case map[string]any:
			if e.isIndex {
				return nil, false
			}
			v = x[e.key]
		case []map[string]any:
			if !e.isIndex || e.index >= len(x) {
				return nil, false
			}
			v = x[e.index]
		case []any:
			if !e.isIndex || e.index >= len(x) {
				return nil, false
			}
			v = x[e.index]
		default:
			return nil, false
		}
		if v == nil {
			return nil, false
		}
	}
	return v, true
}

// setDefaults fills in what the file leaves unset.
func (l *loader) setDefaults(cfg *Config) {
	if l.mode == ModeRun {
		if !l.has(keyPath{}.k("commit_interval")) {
			cfg.CommitInterval = defaultCommitInterval
		}
		if !l.has(keyPath{}.k("metrics").k("listen")) {
			cfg.Metrics.Listen = defaultListen
		}
	}
	if !l.has(keyPath{}.k("shutdown_timeout")) {
		cfg.ShutdownTimeout = defaultShutdownTimeout
	}
	if l.mode == ModePipe && !l.has(keyPath{}.k("max_delayed_mib")) {
		cfg.MaxDelayedMiB = defaultMaxDelayedMiB
	}
	cfg.Log.Level = cmp.Or(cfg.Log.Level, "info")
	cfg.Log.Format = cmp.Or(cfg.Log.Format, "auto")
	for i := range cfg.Streams {
		s, p := &cfg.Streams[i], keyPath{}.k("stream").i(i)
		if !l.has(p.k("create")) {
			s.Create = true
		}
		if !l.has(p.k("beacon_interval")) {
			s.BeaconInterval = streamfile.DefaultBeaconInterval
		}
		if !l.has(p.k("poll_interval")) {
			s.PollInterval = defaultPollInterval
		}
		if !l.has(p.k("file_mode")) {
			s.FileMode = defaultFileMode
		}
		if !l.has(p.k("rotation_grace")) {
			s.RotationGrace = defaultRotationGrace
		}
	}
	for i := range cfg.Subscriptions {
		s := &cfg.Subscriptions[i]
		s.Concurrency = cmp.Or(s.Concurrency, 1)
		if s.Backoff == nil {
			s.Backoff = defaultBackoff()
		}
		s.MaxRetryAfter = cmp.Or(s.MaxRetryAfter, DefaultMaxRetryAfter)
		s.LogUnsupported = cmp.Or(s.LogUnsupported, "first")
		if l.mode == ModeRun {
			s.OnCorrupt = cmp.Or(s.OnCorrupt, "skip")
		} else {
			s.OnInvalid = cmp.Or(s.OnInvalid, "skip")
		}
		h := &s.Handler
		if h.BatchMaxRecords > 0 {
			h.BatchMaxBytes = cmp.Or(h.BatchMaxBytes, DefaultBatchMaxBytes)
			h.BatchLinger = cmp.Or(h.BatchLinger, DefaultBatchLinger)
		}
		switch h.Kind {
		case HandlerHTTP:
			h.Timeout = cmp.Or(h.Timeout, DefaultHTTPTimeout)
		case HandlerNATS:
			h.Timeout = cmp.Or(h.Timeout, DefaultNATSTimeout)
		case HandlerExec:
			h.Timeout = cmp.Or(h.Timeout, DefaultExecTimeout)
		case HandlerStdout:
			h.Format = cmp.Or(h.Format, "log")
		}
	}
}
