package conf

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/internal/httpfield"
	"github.com/streamd/streamd/streamfile"
)

// primingKey is the stream key of the record that primes a new stream file
// (spec/settlement.md §7.2); no subscription may read or write it.
const primingKey = "ruststream-internal"

// globChars are the characters of a shell pattern, which a stream path
// must not hold: streamd would create a file literally named so.
const globChars = "*?["

// Limits.
const (
	maxConcurrency = 1024
	maxNameLen     = 64
)

// validate checks a well-typed configuration, resolving its relative paths.
// Each problem is collected in l.
func (l *loader) validate(cfg *Config) {
	root := keyPath{}
	switch l.mode {
	case ModeRun:
		p := root.k("state_dir")
		switch {
		case l.has(p):
			cfg.StateDir = l.filePath(p, cfg.StateDir)
		case firstEntry(os.Getenv("STATE_DIRECTORY")) != "":
			cfg.StateDir = firstEntry(os.Getenv("STATE_DIRECTORY"))
			if !filepath.IsAbs(cfg.StateDir) {
				l.errorf(p, "$STATE_DIRECTORY %q is not an absolute path", cfg.StateDir)
			}
		default:
			l.errorf(p, "required: the directory for positions and the retry spool (or $STATE_DIRECTORY, which systemd's StateDirectory= sets)")
		}
		l.atLeast(root.k("commit_interval"), cfg.CommitInterval, minInterval, "each commit fsyncs the sidecar")
		l.unused(root.k("max_delayed_mib"), "delayed copies wait in the retry spool on disk (a pipe stage's key: is this streamd pipe's file? check-config --mode=pipe checks it as one)")
	case ModePipe:
		if p := root.k("max_delayed_mib"); l.has(p) && (cfg.MaxDelayedMiB <= 0 || cfg.MaxDelayedMiB > maxDelayedMiB) {
			l.errorf(p, "must be 1 to %d (MiB), not %d", maxDelayedMiB, cfg.MaxDelayedMiB)
		}
		l.unused(root.k("state_dir"), "a pipe stage keeps no state")
		l.unused(root.k("commit_interval"), "a pipe stage commits no positions")
		l.unused(root.k("stream"), "a pipe stage reads stdin and writes stdout, not stream files")
	}
	l.positive(root.k("shutdown_timeout"), cfg.ShutdownTimeout)
	l.oneOf(root.k("log").k("level"), &cfg.Log.Level, "debug", "info", "warn", "error")
	l.oneOf(root.k("log").k("format"), &cfg.Log.Format, "auto", "text", "json")
	if p := root.k("metrics").k("listen"); cfg.Metrics.Listen != "" {
		l.hostPort(p, cfg.Metrics.Listen)
	}
	if p := root.k("metrics").k("web_config_file"); l.has(p) {
		cfg.Metrics.WebConfigFile = l.filePath(p, cfg.Metrics.WebConfigFile)
		if cfg.Metrics.Listen == "" && (l.mode == ModePipe || l.has(root.k("metrics").k("listen"))) {
			l.errorf(p, "set, but [metrics] listen is empty: there is no listener to secure")
		}
	}

	streams := map[string]keyPath{}
	var unnamed []keyPath // [[stream]] tables without a name, which streams cannot list
	if l.mode == ModeRun {
		files := map[string]keyPath{}
		for i := range cfg.Streams {
			p := root.k("stream").i(i)
			l.checkStream(p, &cfg.Streams[i], streams, files)
			if !l.has(p.k("name")) {
				unnamed = append(unnamed, p)
			}
		}
	}
	if len(cfg.Subscriptions) == 0 {
		l.errorf(root.k("subscription"), "at least one [[subscription]] is needed")
	}
	names := map[string]keyPath{}
	for i := range cfg.Subscriptions {
		l.checkSubscription(root.k("subscription").i(i), &cfg.Subscriptions[i], streams, unnamed, names)
	}
	if l.mode == ModePipe {
		l.sameOnInvalid(root.k("subscription"), cfg.Subscriptions)
	} else {
		l.deadLetterCycles(root.k("subscription"), cfg.Subscriptions)
	}
}

// deadLetterCycles refuses subscriptions of one stream whose dead letters
// come back to them through others: each reads the key the one before it
// dead-letters to. A record their handlers keep failing would go round
// for ever, dead-lettered at once at each hop, its retry count past every
// cap. It is said once, at the dead_letter of the first subscription of
// the round; one that dead-letters to its own key is refused where it is
// checked.
func (l *loader) deadLetterCycles(p keyPath, subs []Subscription) {
	type streamKey struct{ stream, key string }
	readers := map[streamKey][]int{}
	for i, s := range subs {
		k := streamKey{s.Stream, s.Key}
		readers[k] = append(readers[k], i)
	}
	said := map[int]bool{}
	for i, s := range subs {
		if s.DeadLetter == "" || s.DeadLetter == s.Key || said[i] {
			continue
		}
		// The keys the dead letters of subscription i reach, each with
		// the subscription whose dead letters reach it first.
		from := map[string]int{s.DeadLetter: i}
		queue := []string{s.DeadLetter}
		for len(queue) > 0 {
			k := queue[0]
			queue = queue[1:]
			for _, j := range readers[streamKey{s.Stream, k}] {
				d := subs[j].DeadLetter
				if _, seen := from[d]; d != "" && d != k && !seen {
					from[d] = j
					queue = append(queue, d)
				}
			}
			if _, back := from[s.Key]; back {
				break
			}
		}
		j, back := from[s.Key]
		if !back {
			continue
		}
		round := []string{s.Name}
		for ; j != i; j = from[subs[j].Key] {
			said[j] = true
			round = slices.Insert(round, 1, subs[j].Name)
		}
		l.errorf(p.i(i).k("dead_letter"), "%q is read by subscription %q, and the dead letters go round (subscriptions %s, then %q again) on stream %q: a record their handlers keep failing would be dead-lettered at each of them at once, for ever; end the chain at a key no subscription of the stream reads",
			s.DeadLetter, round[1], strings.Join(round, ", "), s.Name, s.Stream)
	}
}

// sameOnInvalid refuses a stage whose subscriptions set different
// on_invalid values: a stage reads each line once, and a line it cannot
// parse has no key that would say whose setting applies.
func (l *loader) sameOnInvalid(p keyPath, subs []Subscription) {
	first := -1
	for i, s := range subs {
		q := p.i(i).k("on_invalid")
		switch {
		case !l.has(q):
		case first < 0:
			first = i
		case s.OnInvalid != subs[first].OnInvalid:
			l.errorf(q, "%q, where %s is %q: a stage reads each line once, and an invalid line has no key to say whose setting applies; set the same in every subscription",
				s.OnInvalid, p.i(first).k("on_invalid"), subs[first].OnInvalid)
		}
	}
}

// streamHint names the stream that an unknown stream name was probably
// meant to be, or else the streams there are, and where the [[stream]]
// tables of unnamed are, which have no name (reported at their own line):
// the stream meant may be one of them.
func (l *loader) streamHint(name string, streams map[string]keyPath, unnamed []keyPath) string {
	known := slices.Sorted(maps.Keys(streams))
	for _, s := range known {
		if limit := max(1, len(name)/4); abs(len(s)-len(name)) <= limit && editDistance(s, name) <= limit {
			return fmt.Sprintf("; did you mean %q?", s)
		}
	}
	var hint string
	switch {
	case len(known) > 0:
		quoted := make([]string, len(known))
		for i, s := range known {
			quoted[i] = strconv.Quote(s)
		}
		hint = "; the streams are " + strings.Join(quoted, ", ")
	case len(unnamed) == 0:
		return "; there is no [[stream]] table"
	}
	if len(unnamed) == 0 {
		return hint
	}
	places := make([]string, len(unnamed))
	for i, p := range unnamed {
		places[i] = fmt.Sprintf("%s:%d", l.file, l.lines.line(p))
	}
	if len(places) == 1 {
		return hint + "; the [[stream]] table at " + places[0] + " has no name: set its name"
	}
	return hint + "; the [[stream]] tables at " + andList(places) + " have no name: set their names"
}

func (l *loader) checkStream(p keyPath, s *Stream, streams, files map[string]keyPath) {
	l.name(p.k("name"), s.Name, "stream", streams)
	if !l.has(p.k("path")) {
		l.errorf(p.k("path"), "required: the stream file")
	} else if s.Path = l.filePath(p.k("path"), s.Path); strings.ContainsAny(s.Path, globChars) {
		l.errorf(p.k("path"), "%q holds a glob character (%s): streamd reads one file per [[stream]], not a pattern; name the file, with one [[stream]] for each", s.Path, globChars)
	} else if s.Path != "" {
		if q, dup := files[s.Path]; dup {
			l.errorf(p.k("path"), "%s is also the file of %s", s.Path, q)
		} else {
			files[s.Path] = p
		}
	}
	if q := p.k("beacon_interval"); l.has(q) {
		if err := streamfile.CheckBeaconInterval(int64(s.BeaconInterval)); err != nil {
			l.errorf(q, "%v", err)
		}
	}
	l.atLeast(p.k("poll_interval"), s.PollInterval, minInterval, "each poll reads the file's size")
	if s.RotationGrace < 0 {
		l.errorf(p.k("rotation_grace"), "must not be negative, not %s", s.RotationGrace)
	}
}

func (l *loader) checkSubscription(p keyPath, s *Subscription, streams map[string]keyPath, unnamed []keyPath, names map[string]keyPath) {
	l.name(p.k("name"), s.Name, "subscription", names)
	for i, old := range s.RenamedFrom {
		l.name(p.k("renamed_from").i(i), old, "former subscription", names)
	}
	keyOK := false
	if !l.has(p.k("key")) {
		l.errorf(p.k("key"), "required: the stream key to read")
	} else {
		keyOK = l.streamKey(p.k("key"), s.Key)
	}
	switch l.mode {
	case ModeRun:
		switch q := p.k("stream"); {
		case !l.has(q):
			l.errorf(q, "required: the name of the [[stream]] to read")
		case streams[s.Stream] == nil:
			l.errorf(q, "no [[stream]] is named %q%s", s.Stream, l.streamHint(s.Stream, streams, unnamed))
		}
		if s.Replay && s.StartAt.IsEnd() {
			l.errorf(p.k("replay"), "start_at = %q leaves nothing to replay", s.StartAt)
		}
		l.unused(p.k("on_invalid"), "it is for invalid stdin lines of a pipe stage (is this streamd pipe's file? check-config --mode=pipe checks it as one)")
		l.oneOf(p.k("on_corrupt"), &s.OnCorrupt, "skip", "stop")
	case ModePipe:
		l.unused(p.k("stream"), "a pipe stage reads stdin")
		l.unused(p.k("start_at"), "a pipe stage cannot seek")
		l.unused(p.k("replay"), "a pipe stage cannot replay")
		l.unused(p.k("on_corrupt"), "stdin has no checksums; see on_invalid")
		l.unused(p.k("renamed_from"), "a stage's copies leave on stdout under out_retry, which names no subscription")
		l.unused(p.k("concurrency"), "a stage hands its handler one stdin line at a time")
		l.oneOf(p.k("on_invalid"), &s.OnInvalid, "skip", "fail")
		if !l.has(p.k("out_retry")) {
			dest := "<key>"
			if keyOK && streamfile.ValidKey(s.Key+".retry") == nil {
				dest = s.Key + ".retry"
			}
			l.errorf(p.k("out_retry"), "subscription %q: a pipe stage must name a retry destination: set out_retry = %q (copies leave on stdout under that key)", s.Name, dest)
		}
	}
	if l.has(p.k("dead_letter")) && l.streamKey(p.k("dead_letter"), s.DeadLetter) && s.DeadLetter == s.Key {
		l.errorf(p.k("dead_letter"), "%q is the key the subscription reads: its dead letters would come back to it", s.Key)
	}
	if l.has(p.k("out_retry")) {
		l.streamKey(p.k("out_retry"), s.OutRetry)
	}
	if n := s.Concurrency; l.has(p.k("concurrency")) && (n < 1 || n > maxConcurrency) {
		l.errorf(p.k("concurrency"), "must be from 1 to %d, not %d", maxConcurrency, n)
	}
	if s.MaxAttempts != nil && *s.MaxAttempts < 1 {
		l.errorf(p.k("max_attempts"), "must be 1 or more (the first delivery is attempt 1), not %d; leave it out for no cap", *s.MaxAttempts)
	}
	if q := p.k("backoff"); l.has(q) {
		if len(s.Backoff) == 0 {
			l.errorf(q, "must hold at least one delay")
		}
		for i, d := range s.Backoff {
			l.atLeast(q.i(i), d, minBackoff, "a failed delivery is sent again after it")
		}
	}
	switch {
	case s.MaxFailedDeliveries < 0:
		l.errorf(p.k("max_failed_deliveries"), "must be 1 or more, not %d; leave it out to hold a record until the handler answers", s.MaxFailedDeliveries)
	case s.MaxFailedDeliveries > 0 && s.MaxAttempts == nil && s.DeadLetter == "":
		// A retry writes no copy without either (settlement.md §4).
		l.errorf(p.k("max_failed_deliveries"), "settles a record that keeps failing as a retry, which without max_attempts or dead_letter writes no copy: the record would be passed over, lost; set max_attempts (and dead_letter to keep what the cap gives up on), or leave max_failed_deliveries out to hold the record until the handler answers")
	}
	l.positive(p.k("max_retry_after"), s.MaxRetryAfter)
	if p := p.k("max_retry_after"); time.Duration(s.MaxRetryAfter) > maxRetryAfterLimit {
		l.errorf(p, "must be at most %s (ten years), not %s: a delayed copy is kept for that long at most", maxRetryAfterLimit, time.Duration(s.MaxRetryAfter))
	}
	l.oneOf(p.k("log_unsupported"), &s.LogUnsupported, "first", "every", "off")
	l.checkHandler(p.k("handler"), &s.Handler, s.Key)
}

// maxRetryAfterLimit bounds max_retry_after, far below what the retry
// queue can schedule (the year 2262), so that a delay it allows can always
// be scheduled.
const maxRetryAfterLimit = 10 * 365 * 24 * time.Hour

// checkHandler checks the handler of the subscription that reads key.
func (l *loader) checkHandler(p keyPath, h *Handler, key string) {
	var kinds []string
	var options []string
	known := false
	for _, k := range handlerKinds {
		kinds = append(kinds, k.kind)
		if strings.EqualFold(k.kind, h.Kind) { // a value, matched as oneOf matches
			h.Kind, options, known = k.kind, k.options, true
		}
	}
	switch kp := p.k("kind"); {
	case !l.has(kp):
		l.errorf(kp, "required: use %s", orList(kinds))
		return
	case !known:
		l.errorf(kp, "unknown handler kind %q: use %s", h.Kind, orList(kinds))
		return
	case h.Kind == HandlerStdout && l.mode == ModePipe:
		l.errorf(kp, "streamd pipe cannot use the stdout handler: stdout carries the stage's output")
	}
	table, _ := l.lookup(p)
	for name := range table.(map[string]any) {
		if name != "kind" && !slices.Contains(options, name) {
			takes := "takes no options"
			if len(options) > 0 {
				takes = "takes " + andList(options)
			}
			l.errorf(p.k(name), "not an option of the %s handler, which %s", h.Kind, takes)
		}
	}
	switch h.Kind {
	case HandlerHTTP:
		l.checkHTTP(p, h)
	case HandlerExec:
		l.checkExec(p, h)
	case HandlerStdout:
		l.oneOf(p.k("format"), &h.Format, "log", "ndjson")
	case HandlerNATS:
		l.checkNATS(p, h, key)
	}
}

// checkNATS checks a nats handler and replaces {key} in its subject.
func (l *loader) checkNATS(p keyPath, h *Handler, key string) {
	if q := p.k("url"); !l.has(q) {
		l.errorf(q, "required: the NATS server, as in nats://127.0.0.1:4222, or several separated by commas")
	} else {
		for _, s := range strings.Split(h.URL, ",") {
			s = strings.TrimSpace(s)
			u, err := url.Parse(s)
			switch {
			case err != nil:
				l.errorf(q, "not a URL (%v): use a nats://host:port URL (or tls://, ws://, wss://)", errors.Unwrap(err))
			case !slices.Contains([]string{"nats", "tls", "ws", "wss"}, u.Scheme) || u.Host == "":
				l.errorf(q, "%q: use a nats://host:port URL (or tls://, ws://, wss://)", s)
			case u.User != nil:
				l.errorf(q, "%q holds credentials: the configuration holds no secrets; use creds_file, nkey_file or user and password_file", u.Redacted())
			}
		}
	}
	if q := p.k("subject"); !l.has(q) {
		l.errorf(q, `required: the subject records are published to, in which {key} is the stream key, as in "orders.{key}"`)
	} else if subject := strings.ReplaceAll(h.Subject, "{key}", key); !validSubject(subject) {
		l.errorf(q, "%q makes the subject %q, which is not a NATS subject to publish to: use tokens of printable characters without spaces, * or >, separated by single dots", h.Subject, subject)
	} else if unknown := placeholder(subject); unknown != "" {
		l.errorf(q, "%q: %s is not a placeholder streamd replaces; {key}, the stream key, is the only one", h.Subject, unknown)
	} else {
		h.Subject = subject
	}
	l.positive(p.k("timeout"), h.Timeout)
	var auth []string
	for _, name := range []string{"creds_file", "nkey_file", "user"} {
		if l.has(p.k(name)) {
			auth = append(auth, name)
		}
	}
	if len(auth) > 1 {
		l.errorf(p.k(auth[1]), "set only one of creds_file, nkey_file and user (with password_file)")
	}
	if l.has(p.k("user")) != l.has(p.k("password_file")) {
		l.errorf(p.k("password_file"), "user and password_file go together")
	}
	if l.has(p.k("cert_file")) != l.has(p.k("key_file")) {
		l.errorf(p.k("key_file"), "cert_file and key_file go together: the client certificate and its key")
	}
	for name, path := range map[string]*string{"creds_file": &h.CredsFile, "nkey_file": &h.NkeyFile, "password_file": &h.PasswordFile, "ca_file": &h.CAFile, "cert_file": &h.CertFile, "key_file": &h.KeyFile} {
		if q := p.k(name); l.has(q) {
			*path = l.filePath(q, *path)
		}
	}
	l.checkBatch(p, h)
}

// placeholder returns the first {name} in s, "" if it holds none: in a
// subject after {key} was replaced, a mistyped placeholder such as {Key},
// which would otherwise be published to as it is.
func placeholder(s string) string {
	start := strings.IndexByte(s, '{')
	if start < 0 {
		return ""
	}
	end := strings.IndexByte(s[start:], '}')
	if end < 0 {
		return ""
	}
	return s[start : start+end+1]
}

// validSubject reports whether s is a NATS subject a message can be
// published to: dot-separated tokens, none empty, of printable ASCII
// without spaces and without the wildcards * and >.
func validSubject(s string) bool {
	for _, token := range strings.Split(s, ".") {
		if token == "" {
			return false
		}
		for i := 0; i < len(token); i++ {
			if c := token[i]; c <= ' ' || c >= 0x7f || c == '*' || c == '>' {
				return false
			}
		}
	}
	return true
}

func (l *loader) checkHTTP(p keyPath, h *Handler) {
	u, err := url.Parse(h.URL)
	switch q := p.k("url"); {
	case !l.has(q):
		l.errorf(q, "required: the http:// or https:// URL records are POSTed to")
	case err != nil:
		l.errorf(q, "not a URL: %v", errors.Unwrap(err)) // the inner error, without the URL and any secret in it
	case u.Scheme != "http" && u.Scheme != "https":
		l.errorf(q, "%q: use an http:// or https:// URL", h.URL)
	case u.Host == "":
		l.errorf(q, "%q has no host", h.URL)
	case u.User != nil:
		l.errorf(q, "%q holds credentials: the configuration holds no secrets; put a token in bearer_token_file", u.Redacted())
	case !httpfield.ValidRequestTarget(u.RequestURI()):
		l.errorf(q, "%q: the query holds a space, a control character or a byte beyond ASCII; percent-encode it", h.URL)
	}
	l.positive(p.k("timeout"), h.Timeout)
	seen := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
		value := h.Headers[name]
		q := p.k("headers").k(name)
		first, dup := seen[http.CanonicalHeaderKey(name)]
		seen[http.CanonicalHeaderKey(name)] = name
		switch {
		case dup:
			l.errorf(q, "the same header as %q: header names are case-insensitive", first)
		case !httpfield.ValidName(name):
			l.errorf(q, "%q is not an HTTP header name", name)
		case strings.EqualFold(name, "Authorization"):
			l.errorf(q, "the configuration holds no secrets: put the token in bearer_token_file")
		case httpfield.Reserved(name) != "":
			l.errorf(q, "%s", httpfield.Reserved(name))
		case strings.EqualFold(name, "Host") && !httpfield.ValidHost(value):
			l.errorf(q, "%q is not a host[:port] (a name with letters beyond ASCII goes in its xn-- form)", value)
		case strings.ContainsAny(value, "\r\n\x00"):
			l.errorf(q, "a header value must not contain CR, LF or NUL")
		}
	}
	l.checkBatch(p, h)
	if q := p.k("bearer_token_file"); l.has(q) {
		h.BearerTokenFile = l.filePath(q, h.BearerTokenFile)
	}
	if q := p.k("ca_file"); l.has(q) {
		h.CAFile = l.filePath(q, h.CAFile)
		if err == nil && u.Scheme == "http" {
			l.errorf(q, "the URL is http://; a CA file is only used for https://")
		}
	}
}

// checkBatch checks the batch options of an http or nats handler.
func (l *loader) checkBatch(p keyPath, h *Handler) {
	q := p.k("batch_max_records")
	if !l.has(q) {
		for _, name := range []string{"batch_max_bytes", "batch_linger"} {
			if l.has(p.k(name)) {
				l.errorf(p.k(name), "only used with batch_max_records, which turns batches on")
			}
		}
		return
	}
	if l.mode == ModePipe {
		l.unused(q, "a stage hands each record to its handler on its own")
		return
	}
	if n := h.BatchMaxRecords; n < 1 || n > MaxBatchRecords {
		l.errorf(q, "must be from 1 to %d, not %d; leave it out to hand the handler one record at a time", MaxBatchRecords, n)
	}
	if n := h.BatchMaxBytes; l.has(p.k("batch_max_bytes")) && (n < 1 || n > MaxBatchBytes) {
		l.errorf(p.k("batch_max_bytes"), "must be from 1 to %d, not %d", MaxBatchBytes, n)
	}
	l.positive(p.k("batch_linger"), h.BatchLinger)
}

func (l *loader) checkExec(p keyPath, h *Handler) {
	q := p.k("command")
	switch {
	case !l.has(q):
		l.errorf(q, `required: the program and its arguments, as in ["/usr/local/bin/handle", "--json"]`)
	case len(h.Command) == 0:
		l.errorf(q, "must name at least the program")
	case h.Command[0] == "":
		l.errorf(q.i(0), "the program must not be empty")
	case strings.Contains(h.Command[0], "/"):
		h.Command[0] = l.filePath(q.i(0), h.Command[0]) // one without a slash is looked up in $PATH
	}
	for i, arg := range h.Command {
		if strings.ContainsRune(arg, 0) {
			l.errorf(q.i(i), "must not contain a NUL byte")
		}
	}
	l.positive(p.k("timeout"), h.Timeout)
	for name, value := range h.Env {
		switch q := p.k("env").k(name); {
		case name == "" || strings.ContainsAny(name, "=\x00"):
			l.errorf(q, "%q is not an environment variable name", name)
		case strings.ContainsRune(value, 0):
			l.errorf(q, "must not contain a NUL byte")
		}
	}
}

// name checks the name of a stream or subscription: set, well formed, and
// not already in seen, which it is added to.
func (l *loader) name(p keyPath, name, what string, seen map[string]keyPath) {
	switch {
	case !l.has(p):
		l.errorf(p, "required: the %s's name", what)
	case len(name) == 0 || len(name) > maxNameLen || strings.ContainsFunc(name, func(r rune) bool { return !nameRune(r) }):
		l.errorf(p, "%s name %q: use 1 to %d characters of A-Z a-z 0-9 . _ -", what, name, maxNameLen)
		if seen[name] == nil {
			seen[name] = p // reported once, here, not again where it is used
		}
	case seen[name] != nil:
		by := seen[name] // the name of a table, or a former name it lists
		if last := by[len(by)-1]; !last.isIndex && last.key == "name" {
			by = by[:len(by)-1]
		}
		l.errorf(p, "%s name %q is already used by %s", what, name, by)
	default:
		seen[name] = p
	}
}

func nameRune(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-'
}

// streamKey checks a stream key a subscription reads or writes, and
// reports whether it is good.
func (l *loader) streamKey(p keyPath, key string) bool {
	if err := streamfile.ValidKey(key); err != nil {
		l.errorf(p, "%v", err)
		return false
	}
	switch key {
	case primingKey:
		l.errorf(p, "stream key %q is reserved for the record that primes a new file", key)
		return false
	case streamfile.EOSKey:
		l.errorf(p, "stream key %q is reserved for the end-of-stream mark", key)
		return false
	case streamfile.WildcardKey:
		l.errorf(p, "%v", streamfile.ReservedKey(key))
		return false
	}
	return true
}

// filePath checks a path from the file at p and returns it absolute and
// clean: a relative path is taken from the configuration file's directory.
func (l *loader) filePath(p keyPath, path string) string {
	switch {
	case path == "":
		l.errorf(p, "must not be empty")
		return ""
	case strings.ContainsRune(path, 0):
		l.errorf(p, "must not contain a NUL byte")
		return ""
	case strings.HasPrefix(path, "~"):
		l.errorf(p, "%q: ~ is not expanded; write the whole path", path)
		return ""
	case !filepath.IsAbs(path):
		path = filepath.Join(l.dir, path)
	}
	return filepath.Clean(path)
}

// hostPort checks a listen address: its host must be empty (every
// address), an IP address or a host name. Whether a name resolves is left
// to check-config --handlers (daemon's checkListen): Load reads no network.
func (l *loader) hostPort(p keyPath, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		l.errorf(p, "%q is not host:port, as in 127.0.0.1:9464", addr)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		l.errorf(p, "port %q is not a number from 1 to 65535", port)
	}
	if ip, _, _ := strings.Cut(host, "%"); host != "" && net.ParseIP(ip) == nil && !hostName(host) {
		l.errorf(p, "host %q is neither an IP address nor a host name: streamd could not listen there; write an address of this machine, as in 127.0.0.1:9464 or [::1]:9464, or its name", host)
	}
}

// hostName reports whether s is a DNS host name: dot-separated labels of
// 1 to 63 letters, digits, hyphens (not first or last) and underscores, at
// most 253 bytes without a trailing dot, the last label not all digits
// (999.1.1.1 is a mistyped IP address, which a lookup cannot find).
func hostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, label := range labels {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.ContainsFunc(label, func(r rune) bool { return !nameRune(r) || r == '.' }) {
			return false
		}
	}
	return strings.ContainsFunc(labels[len(labels)-1], func(r rune) bool { return r < '0' || r > '9' })
}

// positive checks that a duration the file sets is more than zero.
func (l *loader) positive(p keyPath, d Duration) {
	if l.has(p) && d <= 0 {
		l.errorf(p, "must be positive, not %s", d)
	}
}

// The least intervals the file may set: less is a typo ("1us" for "1s")
// that would keep a core busy.
const (
	minInterval = 10 * time.Millisecond // commit_interval, poll_interval
	minBackoff  = time.Millisecond      // a backoff step
)

// atLeast checks that a duration the file sets is least or more; why says
// what happens each time it passes.
func (l *loader) atLeast(p keyPath, d Duration, least time.Duration, why string) {
	if l.has(p) && time.Duration(d) < least {
		l.errorf(p, "must be at least %s, not %s: %s", least, time.Duration(d), why)
	}
}

// oneOf checks that a string the file sets is one of values, which are
// lower case, and makes it lower case: values are matched whatever their
// case, as --log.level matches WARN, and only keys are case-sensitive.
func (l *loader) oneOf(p keyPath, v *string, values ...string) {
	if !l.has(p) {
		return
	}
	if lower := strings.ToLower(*v); slices.Contains(values, lower) {
		*v = lower
		return
	}
	l.errorf(p, "unknown value %q: use %s", *v, orList(values))
}

// unused reports a key the file sets that the mode does not use.
func (l *loader) unused(p keyPath, why string) {
	if l.has(p) {
		l.errorf(p, "not used by streamd %s: %s", l.mode, why)
	}
}

func orList(words []string) string  { return list(words, "or") }
func andList(words []string) string { return list(words, "and") }

// list writes words as "a, b or c".
func list(words []string, conj string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " " + conj + " " + words[len(words)-1]
}
