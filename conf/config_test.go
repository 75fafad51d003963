package conf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/tail"

	"github.com/BurntSushi/toml"
)

// TestLoadConfigBad loads each testdata/config/*.bad.toml and compares the
// whole error text. In want, each line starts with F for the file's path.
func TestLoadConfigBad(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", "")
	type row struct {
		name string
		mode Mode
		want string
	}
	tests := []row{
		{"backoff-empty", ModeRun, `F:11: subscription[0].backoff: must hold at least one delay`},
		{"backoff", ModeRun, `F:11: subscription[0].backoff[1]: must be at least 1ms, not 0s: a failed delivery is sent again after it
F:11: subscription[0].backoff[2]: must be at least 1ms, not -1m0s: a failed delivery is sent again after it
F:11: subscription[0].backoff[3]: must be at least 1ms, not 500µs: a failed delivery is sent again after it`},
		{"bare-integer-duration", ModeRun, `F:2: shutdown_timeout: must be a duration string such as "5s", not the integer 20`},
		{"beacon-interval", ModeRun, `F:6: stream[0].beacon_interval: invalid beacon interval 1000: use a positive multiple of 1024`},
		{"case-mismatch", ModeRun, `F:8: subscription[0].Name: unknown key; keys are case-sensitive: did you mean "name"?`},
		{"duplicate-stream", ModeRun, `F:8: stream[1].name: stream name "orders" is already used by stream[0]`},
		{"duplicate-subscription", ModeRun, `F:15: subscription[1].name: subscription name "billing" is already used by subscription[0]`},
		{"renamed-from", ModeRun, `F:9: subscription[0].renamed_from[1]: former subscription name "bad name": use 1 to 64 characters of A-Z a-z 0-9 . _ -
F:16: subscription[1].name: subscription name "invoicing" is already used by subscription[0].renamed_from[0]
F:17: subscription[1].renamed_from[0]: former subscription name "billing" is already used by subscription[0]`},
		{"duration-string", ModeRun, `F:11: subscription[0].backoff[1]: invalid duration "5 seconds": write a number with a unit, as in "5s" or "2m"`},
		{"exec-no-command", ModeRun, `F:11: subscription[0].handler.command: required: the program and its arguments, as in ["/usr/local/bin/handle", "--json"]`},
		{"handler-foreign-option", ModeRun, `F:14: subscription[0].handler.command: not an option of the http handler, which takes url, timeout, headers, bearer_token_file, ca_file, batch_max_records, batch_max_bytes and batch_linger
F:15: subscription[0].handler.format: not an option of the http handler, which takes url, timeout, headers, bearer_token_file, ca_file, batch_max_records, batch_max_bytes and batch_linger`},
		{"handler-kind", ModeRun, `F:12: subscription[0].handler.kind: unknown handler kind "kafka": use http, exec, stdout, discard or nats`},
		{"http-no-url", ModeRun, `F:11: subscription[0].handler.url: required: the http:// or https:// URL records are POSTed to`},
		{"http-headers", ModeRun, `F:13: subscription[0].handler.url: "http://billing.example/orders?tenant=a b": the query holds a space, a control character or a byte beyond ASCII; percent-encode it
F:14: subscription[0].handler.headers.Content-Length: Content-Length is written by streamd's HTTP transport
F:14: subscription[0].handler.headers.Host: "bücher.example" is not a host[:port] (a name with letters beyond ASCII goes in its xn-- form)
F:14: subscription[0].handler.headers.Streamd-Seq: the Streamd- prefix is reserved for the headers streamd sends with each record
F:14: subscription[0].handler.headers.user-agent: the same header as "User-Agent": header names are case-insensitive`},
		{"http-secrets", ModeRun, `F:13: subscription[0].handler.url: "https://bob:xxxxx@billing.example/orders" holds credentials: the configuration holds no secrets; put a token in bearer_token_file
F:15: subscription[0].handler.headers."Bad Name": "Bad Name" is not an HTTP header name
F:15: subscription[0].handler.headers.Authorization: the configuration holds no secrets: put the token in bearer_token_file`},
		{"nats", ModeRun, `F:11: subscription[0].handler.key_file: cert_file and key_file go together: the client certificate and its key
F:11: subscription[0].handler.password_file: user and password_file go together
F:13: subscription[0].handler.url: "http://b.example": use a nats://host:port URL (or tls://, ws://, wss://)
F:13: subscription[0].handler.url: "nats://bob:xxxxx@c.example" holds credentials: the configuration holds no secrets; use creds_file, nkey_file or user and password_file
F:14: subscription[0].handler.subject: "orders.{key}" makes the subject "orders.eu..west", which is not a NATS subject to publish to: use tokens of printable characters without spaces, * or >, separated by single dots
F:16: subscription[0].handler.user: set only one of creds_file, nkey_file and user (with password_file)
F:23: subscription[1].handler.url: required: the NATS server, as in nats://127.0.0.1:4222, or several separated by commas
F:25: subscription[1].handler.subject: "ship.*" makes the subject "ship.*", which is not a NATS subject to publish to: use tokens of printable characters without spaces, * or >, separated by single dots
F:33: subscription[2].handler.url: not a URL (first path segment in URL cannot contain colon): use a nats://host:port URL (or tls://, ws://, wss://)
F:34: subscription[2].handler.subject: "audit.{Key}": {Key} is not a placeholder streamd replaces; {key}, the stream key, is the only one`},
		{"inline-array", ModeRun, `F:6: subscription[1].handler.url: not an option of the discard handler, which takes no options`},
		{"max-failed-no-cap", ModeRun, `F:11: subscription[0].max_failed_deliveries: settles a record that keeps failing as a retry, which without max_attempts or dead_letter writes no copy: the record would be passed over, lost; set max_attempts (and dead_letter to keep what the cap gives up on), or leave max_failed_deliveries out to hold the record until the handler answers`},
		{"key-chars", ModeRun, `F:10: subscription[0].key: stream key "a b" has character ' ' at byte 1; allowed are A-Z a-z 0-9 . _ -`},
		{"key-empty", ModeRun, `F:10: subscription[0].key: stream key must be non-empty`},
		{"key-reserved", ModeRun, `F:10: subscription[0].key: stream key "ruststream-internal" is reserved for the record that primes a new file`},
		{"key-wildcard", ModeRun, `F:11: subscription[0].out_retry: stream key "SEA_STREAMER_WILDCARD" is reserved for subscribing to every stream; use another key`},
		{"key-too-long", ModeRun, `F:10: subscription[0].key: stream key is 250 bytes long, the limit is 249`},
		{"web-config", ModeRun, `F:5: metrics.web_config_file: set, but [metrics] listen is empty: there is no listener to secure`},
		{"log-metrics", ModeRun, `F:4: log.level: unknown value "verbose": use debug, info, warn or error
F:5: log.format: unknown value "logfmt": use auto, text or json
F:8: metrics.listen: "9464" is not host:port, as in 127.0.0.1:9464`},
		{"many-types", ModeRun, `F:3: commit_interval: must be a duration string such as "5s", not the integer 1
F:4: Shutdown_Timeout: unknown key; keys are case-sensitive: did you mean "shutdown_timeout"?
F:9: stream[0].create: must be true or false, not the string "yes"
F:15: subscription[0].max_attempts: must be an integer, not the float 2.5
F:16: subscription[0].backoff: must be an array, not the string "1s"
F:19: subscription[0].handler.command: must be an array, not the string "/bin/true"`},
		{"many", ModeRun, `F:7: stream[0].beacon_interval: invalid beacon interval 1000: use a positive multiple of 1024
F:12: subscription[0].key: stream key "a b" has character ' ' at byte 1; allowed are A-Z a-z 0-9 . _ -
F:13: subscription[0].concurrency: must be from 1 to 1024, not 2000
F:14: subscription[0].handler.url: required: the http:// or https:// URL records are POSTed to
F:18: subscription[1].name: subscription name "billing" is already used by subscription[0]
F:19: subscription[1].stream: no [[stream]] is named "payments"; the streams are "orders"
F:21: subscription[1].max_attempts: must be 1 or more (the first delivery is attempt 1), not 0; leave it out for no cap
F:22: subscription[1].handler.command: required: the program and its arguments, as in ["/usr/local/bin/handle", "--json"]`},
		{"max-attempts-zero", ModeRun, `F:11: subscription[0].max_attempts: must be 1 or more (the first delivery is attempt 1), not 0; leave it out for no cap`},
		{"missing-stream", ModeRun, `F:9: subscription[0].stream: no [[stream]] is named "order"; did you mean "orders"?`},
		{"pipe-on-invalid", ModePipe, `F:20: subscription[2].on_invalid: "fail", where subscription[0].on_invalid is "skip": a stage reads each line once, and an invalid line has no key to say whose setting applies; set the same in every subscription`},
		{"pipe-no-out-retry", ModePipe, `F:1: subscription[0].out_retry: subscription "jobs": a pipe stage must name a retry destination: set out_retry = "jobs.retry" (copies leave on stdout under that key)`},
		{"pipe-run-keys", ModePipe, `F:1: state_dir: not used by streamd pipe: a pipe stage keeps no state
F:2: commit_interval: not used by streamd pipe: a pipe stage commits no positions
F:4: stream: not used by streamd pipe: a pipe stage reads stdin and writes stdout, not stream files
F:10: subscription[0].stream: not used by streamd pipe: a pipe stage reads stdin
F:12: subscription[0].start_at: not used by streamd pipe: a pipe stage cannot seek
F:14: subscription[0].concurrency: not used by streamd pipe: a stage hands its handler one stdin line at a time
F:15: subscription[0].renamed_from: not used by streamd pipe: a stage's copies leave on stdout under out_retry, which names no subscription`},
		{"pipe-max-delayed", ModePipe, `F:1: max_delayed_mib: must be 1 to 1073741824 (MiB), not 0`},
		{"pipe-max-delayed-huge", ModePipe, `F:1: max_delayed_mib: must be 1 to 1073741824 (MiB), not 8796093022208`},
		{"http-batch", ModeRun, `F:14: subscription[0].handler.batch_max_records: must be from 1 to 10000, not 10001; leave it out to hand the handler one record at a time
F:15: subscription[0].handler.batch_max_bytes: must be from 1 to 268435456, not 0
F:16: subscription[0].handler.batch_linger: must be positive, not 0s
F:25: subscription[1].handler.batch_max_bytes: only used with batch_max_records, which turns batches on
F:26: subscription[1].handler.batch_linger: only used with batch_max_records, which turns batches on
F:35: subscription[2].handler.batch_max_records: not an option of the exec handler, which takes command, timeout and env
F:45: subscription[3].handler.batch_max_records: must be from 1 to 10000, not 0; leave it out to hand the handler one record at a time`},
		{"pipe-batch", ModePipe, `F:8: subscription[0].handler.batch_max_records: not used by streamd pipe: a stage hands each record to its handler on its own`},
		{"pipe-stdout", ModePipe, `F:6: subscription[0].handler.kind: streamd pipe cannot use the stdout handler: stdout carries the stage's output`},
		{"dead-letter-round", ModeRun, `F:16: subscription[0].dead_letter: "orders.dead" is read by subscription "redrive", and the dead letters go round (subscriptions main, redrive, back, then "main" again) on stream "orders": a record their handlers keep failing would be dead-lettered at each of them at once, for ever; end the chain at a key no subscription of the stream reads`},
		{"replay-end", ModeRun, `F:11: subscription[0].replay: start_at = "end" leaves nothing to replay`},
		{"run-keys", ModeRun, `F:2: max_delayed_mib: not used by streamd run: delayed copies wait in the retry spool on disk (a pipe stage's key: is this streamd pipe's file? check-config --mode=pipe checks it as one)
F:12: subscription[0].dead_letter: "orders" is the key the subscription reads: its dead letters would come back to it
F:13: subscription[0].on_invalid: not used by streamd run: it is for invalid stdin lines of a pipe stage (is this streamd pipe's file? check-config --mode=pipe checks it as one)`},
		{"start-at", ModeRun, `F:11: subscription[0].start_at: start position "yesterday": want beginning, end, seq:N, time:RFC3339 or offset:N
F:19: subscription[1].start_at: start position "seq:x": the sequence number must be a decimal integer from 0 to 18446744073709551615`},
		{"state-dir-missing", ModeRun, `F: state_dir: required: the directory for positions and the retry spool (or $STATE_DIRECTORY, which systemd's StateDirectory= sets)`},
		{"syntax", ModeRun, `F:6:13: expected value but found "jobs" instead`},
		{"tilde", ModeRun, `F:1: state_dir: "~/streamd": ~ is not expanded; write the whole path
F:5: stream[0].path: "~/orders.ss": ~ is not expanded; write the whole path`},
		{"unknown-key", ModeRun, `F:2: listen: unknown key; it is a key of the [metrics] table
F:12: subscription[0].nmae: unknown key; did you mean "name"?
F:13: subscription[0].timeout: unknown key; it is a key of the [subscription.handler] table
F:17: subscription[0].handler.bearer_token: unknown key; did you mean "bearer_token_file"?`},
		{"unknown-table", ModeRun, `F:14: storage: unknown table
F:18: sink: unknown table`},
		{"wrong-type", ModeRun, `F:18: subscription[1].concurrency: must be an integer, not the string "4"`},
		{"http-url", ModeRun, `F:11: subscription[0].handler.url: "ftp://billing.example/orders": use an http:// or https:// URL
F:17: subscription[1].handler.url: not a URL: invalid port ":x" after host
F:23: subscription[2].handler.timeout: must be positive, not 0s
F:23: subscription[2].handler.url: "https:///orders" has no host
F:29: subscription[3].handler.ca_file: the URL is http://; a CA file is only used for https://`},
		{"exec-options", ModeRun, `F:13: subscription[0].handler.command[0]: the program must not be empty
F:14: subscription[0].handler.timeout: must be positive, not -1s
F:15: subscription[0].handler.env."A=B": "A=B" is not an environment variable name
F:23: subscription[1].handler.format: unknown value "json": use log or ndjson
F:24: subscription[1].handler.timeout: not an option of the stdout handler, which takes format
F:32: subscription[2].handler.command: not an option of the discard handler, which takes no options`},
		{"names", ModeRun, `F:3: stream[0].name: required: the stream's name
F:7: stream[1].name: stream name "new orders": use 1 to 64 characters of A-Z a-z 0-9 . _ -
F:10: subscription[0].name: required: the subscription's name
F:11: subscription[0].stream: no [[stream]] is named "orders"; the streams are "new orders"; the [[stream]] table at testdata/config/names.bad.toml:3 has no name: set its name
F:15: subscription[1].key: required: the stream key to read
F:16: subscription[1].name: subscription name "billing/eu": use 1 to 64 characters of A-Z a-z 0-9 . _ -
F:20: subscription[2].handler.kind: required: use http, exec, stdout, discard or nats
F:20: subscription[2].stream: required: the name of the [[stream]] to read`},
		{"stream-path", ModeRun, `F:9: stream[1].path: /var/lib/seastreamer/orders.ss is also the file of stream[0]
F:11: stream[2].path: required: the stream file
F:17: stream[3].poll_interval: must be at least 10ms, not 1µs: each poll reads the file's size
F:18: stream[3].beacon_interval: invalid beacon interval 4294967296: use a positive multiple of 1024`},
		{"subscription-options", ModeRun, `F:2: shutdown_timeout: must be positive, not 0s
F:3: commit_interval: must be at least 10ms, not -1s: each commit fsyncs the sidecar
F:13: subscription[0].concurrency: must be from 1 to 1024, not 0
F:14: subscription[0].out_retry: stream key "SEA_STREAMER_INTERNAL" is reserved for the end-of-stream mark
F:15: subscription[0].dead_letter: stream key "orders dead" has character ' ' at byte 6; allowed are A-Z a-z 0-9 . _ -
F:16: subscription[0].log_unsupported: unknown value "all": use first, every or off
F:17: subscription[0].on_corrupt: unknown value "ignore": use skip or stop
F:18: subscription[0].max_failed_deliveries: must be 1 or more, not -1; leave it out to hold a record until the handler answers
F:19: subscription[0].max_retry_after: must be positive, not 0s`},
		{"max-retry-after", ModeRun, `F:11: subscription[0].max_retry_after: must be at most 87600h0m0s (ten years), not 2500000h0m0s: a delayed copy is kept for that long at most`},
		{"no-subscription", ModeRun, `F: subscription: at least one [[subscription]] is needed`},
	}
	files, err := filepath.Glob("testdata/config/*.bad.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".bad.toml")
		if !slices.ContainsFunc(tests, func(tc row) bool { return tc.name == name }) {
			t.Errorf("%s has no row in the table", f)
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join("testdata", "config", tc.name+".bad.toml")
			cfg, err := Load(file, tc.mode)
			if err == nil {
				t.Fatalf("Load(%s) = %+v, want an error", file, cfg)
			}
			lines := strings.Split(tc.want, "\n")
			for i, l := range lines {
				lines[i] = file + strings.TrimPrefix(l, "F")
			}
			if want := strings.Join(lines, "\n"); err.Error() != want {
				t.Errorf("Load(%s, %s) error:\n%s\nwant:\n%s", file, tc.mode, err, want)
			}
		})
	}
}

// TestSyntaxErrorPosition checks the line and column of syntax errors
// where the TOML decoder's own are wrong: at the newline that ends a line,
// and at the start of a line.
func TestSyntaxErrorPosition(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"state_dir = \"/x\"\n[metrics\nlisten = \"\"\n", "f.toml:2:9: expected '.' or ']' to end table name, but got '\\n' instead"},
		{"a = 1\nb = {x = 1\nc = 2\n", "f.toml:3:1: expected a comma or an inline table terminator '}', but got 'c' instead"},
		{"a = [1,\n\nbar = 1\n", "f.toml:3:1: expected value but found \"bar\" instead"},
		{"a = 1\nshutdown_timeout = \"5s\n", "f.toml:2:23: strings cannot contain newlines"},
		{"a = 1\nb = 1 2\n", "f.toml:2:6: expected a top-level item to end with a newline, comment, or EOF, but got '2' instead"},
		{"[[stream]]\nfile_mode = 0660\n", `f.toml:2:13: Invalid integer "0660": cannot have leading zeroes: if it is a file mode, write it as a string, as in file_mode = "0660"`},
	} {
		_, err := parse("f.toml", "/etc/streamd", tc.src, ModeRun)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: %v, want %s", tc.src, err, tc.want)
			continue
		}
		pe, _ := errors.AsType[toml.ParseError](err)
		line := strings.Split(tc.src, "\n")[pe.Position.Line-1]
		if excerpt := pe.ErrorWithPosition(); !strings.Contains(excerpt, fmt.Sprintf("%7d | %s\n", pe.Position.Line, line)) {
			t.Errorf("%q: the excerpt does not show line %d:\n%s", tc.src, pe.Position.Line, excerpt)
		}
	}
}

func TestLoadConfigSyntaxError(t *testing.T) {
	_, err := Load("testdata/config/syntax.bad.toml", ModeRun)
	pe, ok := errors.AsType[toml.ParseError](err)
	if !ok {
		t.Fatalf("error %v does not wrap a toml.ParseError", err)
	}
	if pe.Position.Line != 6 || pe.Position.Col != 13 {
		t.Errorf("position %+v, want line 6, column 13", pe.Position)
	}
	if excerpt := pe.ErrorWithPosition(); !strings.Contains(excerpt, "      6 | out_retry = jobs.retry\n                      ^^^^\n") {
		t.Errorf("ErrorWithPosition does not point at line 6:\n%s", excerpt)
	}
}

// TestDetail: a syntax error is shown as "file:line:column: message", like
// every other problem, then the lines around it with a caret under the
// place, without the decoder's own "toml: error:" and "At line" text and
// without a trailing newline; other errors as they are.
func TestDetail(t *testing.T) {
	parseErr := func(src string) error {
		_, err := parse("f.toml", "/etc/streamd", src, ModeRun)
		return err
	}
	missing := filepath.Join(t.TempDir(), "none.toml")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"bare duration", parseErr("state_dir = \"/x\"\nshutdown_timeout = 20s\n"),
			"f.toml:2:22: expected a top-level item to end with a newline, comment, or EOF, but got 's' instead\n\n" +
				"      1 | state_dir = \"/x\"\n" +
				"      2 | shutdown_timeout = 20s\n" +
				"                               ^"},
		{"unquoted path", parseErr("shutdown_timeout = \"20s\"\nstate_dir = /var/lib\n"),
			"f.toml:2:13: expected value but found '/' instead\n\n" +
				"      1 | shutdown_timeout = \"20s\"\n" +
				"      2 | state_dir = /var/lib\n" +
				"                      ^"},
		{"unclosed table", parseErr("[metrics\nlisten = \"\"\n"),
			"f.toml:1:9: expected '.' or ']' to end table name, but got '\\n' instead\n\n" +
				"      1 | [metrics\n" +
				"                  ^"},
		{"key problems", parseErr("state_dir = \"/x\"\nshutdown_timeout = 20\n"),
			"f.toml:2: shutdown_timeout: must be a duration string such as \"5s\", not the integer 20"},
		{"missing file", func() error { _, err := Load(missing, ModeRun); return err }(),
			"open " + missing + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Detail(tc.err); got != tc.want {
				t.Errorf("Detail:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestLoadConfigMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "none.toml"), ModeRun)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v, want one that is os.ErrNotExist", err)
	}
}

// TestExampleConfigs loads every file of configs/ for the command it is for.
func TestExampleConfigs(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", "")
	modes := map[string]Mode{"streamd.toml": ModeRun, "local.toml": ModeRun, "pipe.toml": ModePipe}
	files, err := filepath.Glob("../configs/*")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(modes) {
		t.Errorf("configs/ holds %d files, the test knows %d: %v", len(files), len(modes), files)
	}
	for _, f := range files {
		mode, ok := modes[filepath.Base(f)]
		if !ok {
			t.Errorf("%s: say in this test which mode it is for", f)
			continue
		}
		if _, err := Load(f, mode); err != nil {
			t.Errorf("Load(%s, %s): %v", f, mode, err)
		}
	}
}

// TestLocalConfig checks that configs/local.toml works for make run: its
// files are in var/ at the top of the repository.
func TestLocalConfig(t *testing.T) {
	cfg, err := Load("../configs/local.toml", ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	top, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(top, "var", "state"); cfg.StateDir != want {
		t.Errorf("state_dir %q, want %q", cfg.StateDir, want)
	}
	if want := filepath.Join(top, "var", "demo.ss"); cfg.Streams[0].Path != want {
		t.Errorf("stream path %q, want %q", cfg.Streams[0].Path, want)
	}
	s := cfg.Subscriptions[0]
	if s.Key != "orders" || s.Handler.Kind != HandlerStdout || s.MaxAttempts == nil || s.DeadLetter == "" {
		t.Errorf("subscription %+v, want a stdout handler on orders with max_attempts and dead_letter", s)
	}
}

// TestStreamdTomlDefaults checks that configs/streamd.toml writes every key
// it sets at its default, apart from those of the minimal file here (and
// file_mode, group-writable for the shared directory the path is in).
func TestStreamdTomlDefaults(t *testing.T) {
	const minimal = `
state_dir = "/var/lib/streamd"
[[stream]]
name = "orders"
path = "/var/lib/seastreamer/orders.ss"
file_mode = "0660"
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
max_attempts = 5
dead_letter = "orders.dead"
[subscription.handler]
kind = "http"
url = "http://127.0.0.1:8080/orders"
`
	want, err := parse("minimal.toml", "/etc/streamd", minimal, ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Load("../configs/streamd.toml", ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	got.keys, want.keys = nil, nil // the files differ in lines
	if !reflect.DeepEqual(got, want) {
		t.Errorf("configs/streamd.toml loads as\n%+v\nthe minimal file with defaults as\n%+v", got, want)
	}
}

// TestStreamdTomlDocumentsEveryKey checks that configs/streamd.toml names
// every table and key, set or in a comment.
func TestStreamdTomlDocumentsEveryKey(t *testing.T) {
	data, err := os.ReadFile("../configs/streamd.toml")
	if err != nil {
		t.Fatal(err)
	}
	var check func(t reflect.Type, table string)
	check = func(typ reflect.Type, table string) {
		for _, f := range keyFields(typ) {
			tag := f.Tag.Get("toml")
			name := tag
			if table != "" {
				name = table + "." + tag
			}
			var re string
			switch {
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[tail.Start]():
				re = `(?m)^\[` + regexp.QuoteMeta(name) + `\]$`
				check(f.Type, name)
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				re = `(?m)^\[\[` + regexp.QuoteMeta(name) + `\]\]$`
				check(f.Type.Elem(), name)
			default:
				re = `(?m)^(# )?` + regexp.QuoteMeta(tag) + ` = `
			}
			if !regexp.MustCompile(re).Match(data) {
				t.Errorf("configs/streamd.toml does not document %s (no match for %s)", name, re)
			}
		}
	}
	check(configType, "")
}

// TestConfigTags checks that every field of the configuration has its own
// toml tag, and that the handler kinds' options are tags.
func TestConfigTags(t *testing.T) {
	var check func(t reflect.Type)
	check = func(typ reflect.Type) {
		seen := map[string]bool{}
		for _, f := range keyFields(typ) {
			tag := f.Tag.Get("toml")
			if tag == "" || strings.ContainsAny(tag, ", ") || seen[tag] {
				t.Errorf("%s.%s: tag %q, want a unique key name", typ, f.Name, tag)
			}
			seen[tag] = true
			switch {
			case f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == configType.PkgPath() && f.Type != reflect.TypeFor[tail.Start]():
				check(f.Type)
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				check(f.Type.Elem())
			}
		}
	}
	check(configType)

	options := map[string]bool{"kind": true}
	for _, k := range handlerKinds {
		for _, o := range k.options {
			if _, ok := fieldByTag(reflect.TypeFor[Handler](), o); !ok {
				t.Errorf("handler kind %s: option %q is no Handler tag", k.kind, o)
			}
			options[o] = true
		}
	}
	h := reflect.TypeFor[Handler]()
	for i := range h.NumField() {
		if tag := h.Field(i).Tag.Get("toml"); !options[tag] {
			t.Errorf("Handler tag %q is an option of no handler kind", tag)
		}
	}
}

func TestDefaults(t *testing.T) {
	t.Setenv("STATE_DIRECTORY", "")
	backoff := []Duration{Duration(time.Second), Duration(5 * time.Second), Duration(30 * time.Second), Duration(2 * time.Minute)}
	day := Duration(24 * time.Hour)
	tests := []struct {
		name string
		mode Mode
		src  string
		want *Config
	}{
		{"run", ModeRun, `
state_dir = "/var/lib/streamd"
[[stream]]
name = "s"
path = "/srv/s.ss"
[[stream]]
name = "t"
path = "/srv/t.ss"
create = false
[[subscription]]
name = "a"
stream = "s"
key = "k"
handler = { kind = "http", url = "https://example.org/" }
[[subscription]]
name = "b"
stream = "t"
key = "k"
handler.kind = "exec"
handler.command = ["handle"]
[[subscription]]
name = "c"
stream = "t"
key = "k"
handler.kind = "stdout"
`, &Config{
			StateDir:        "/var/lib/streamd",
			ShutdownTimeout: Duration(20 * time.Second),
			CommitInterval:  Duration(time.Second),
			Log:             Log{Level: "info", Format: "auto"},
			Metrics:         Metrics{Listen: "127.0.0.1:9464"},
			Streams: []Stream{
				{Name: "s", Path: "/srv/s.ss", Create: true, BeaconInterval: 1 << 20, PollInterval: Duration(time.Second), FileMode: 0o640, RotationGrace: Duration(5 * time.Second)},
				{Name: "t", Path: "/srv/t.ss", Create: false, BeaconInterval: 1 << 20, PollInterval: Duration(time.Second), FileMode: 0o640, RotationGrace: Duration(5 * time.Second)},
			},
			Subscriptions: []Subscription{
				{Name: "a", Stream: "s", Key: "k", Concurrency: 1, Backoff: backoff, MaxRetryAfter: day, LogUnsupported: "first", OnCorrupt: "skip",
					Handler: Handler{Kind: HandlerHTTP, URL: "https://example.org/", Timeout: Duration(5 * time.Second)}},
				{Name: "b", Stream: "t", Key: "k", Concurrency: 1, Backoff: backoff, MaxRetryAfter: day, LogUnsupported: "first", OnCorrupt: "skip",
					Handler: Handler{Kind: HandlerExec, Command: []string{"handle"}, Timeout: Duration(30 * time.Second)}},
				{Name: "c", Stream: "t", Key: "k", Concurrency: 1, Backoff: backoff, MaxRetryAfter: day, LogUnsupported: "first", OnCorrupt: "skip",
					Handler: Handler{Kind: HandlerStdout, Format: "log"}},
			},
		}},
		{"pipe", ModePipe, `
[[subscription]]
name = "jobs"
key = "jobs"
out_retry = "jobs.retry"
[subscription.handler]
kind = "discard"
`, &Config{
			ShutdownTimeout: Duration(20 * time.Second),
			MaxDelayedMiB:   256,
			Log:             Log{Level: "info", Format: "auto"},
			Subscriptions: []Subscription{
				{Name: "jobs", Key: "jobs", OutRetry: "jobs.retry", Concurrency: 1, Backoff: backoff, MaxRetryAfter: day, LogUnsupported: "first", OnInvalid: "skip",
					Handler: Handler{Kind: HandlerDiscard}},
			},
		}},
		{"explicit", ModeRun, `
state_dir = "/var/lib/streamd"
shutdown_timeout = "1m"
commit_interval = "250ms"
log = { level = "DEBUG", format = "json" }
metrics.listen = ""
[[stream]]
name = "s"
path = "/srv/s.ss"
beacon_interval = 4096
poll_interval = "10s"
file_mode = "0660"
rotation_grace = "2s"
[[subscription]]
name = "a"
stream = "s"
key = "k"
start_at = "time:2025-03-01T12:00:00Z"
replay = true
concurrency = 8
max_attempts = 1
dead_letter = "k.dead"
out_retry = "k.retry"
backoff = ["100ms"]
log_unsupported = "every"
on_corrupt = "stop"
[subscription.handler]
kind = "stdout"
format = "ndjson"
`, &Config{
			StateDir:        "/var/lib/streamd",
			ShutdownTimeout: Duration(time.Minute),
			CommitInterval:  Duration(250 * time.Millisecond),
			Log:             Log{Level: "debug", Format: "json"},
			Streams: []Stream{
				{Name: "s", Path: "/srv/s.ss", Create: true, BeaconInterval: 4096, PollInterval: Duration(10 * time.Second), FileMode: 0o660, RotationGrace: Duration(2 * time.Second)},
			},
			Subscriptions: []Subscription{
				{Name: "a", Stream: "s", Key: "k", StartAt: mustStart(t, "time:2025-03-01T12:00:00Z"),
					Replay: true, Concurrency: 8, MaxAttempts: ptr(1), DeadLetter: "k.dead", OutRetry: "k.retry",
					Backoff: []Duration{Duration(100 * time.Millisecond)}, MaxRetryAfter: day, LogUnsupported: "every", OnCorrupt: "stop",
					Handler: Handler{Kind: HandlerStdout, Format: "ndjson"}},
			},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse("test.toml", "/etc/streamd", tc.src, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			got.keys = nil // where the keys are, tested by TestHandlerPlace
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestWebConfigFile checks that a relative web_config_file is taken from
// the configuration file's directory, and an absolute one as it is.
func TestWebConfigFile(t *testing.T) {
	const rest = `
state_dir = "/var/lib/streamd"
[[stream]]
name = "s"
path = "/srv/s.ss"
[[subscription]]
name = "a"
stream = "s"
key = "k"
handler.kind = "discard"
`
	for file, want := range map[string]string{
		"web.yml":                 "/etc/streamd/web.yml",
		"tls/../web.yml":          "/etc/streamd/web.yml",
		"/etc/prometheus/web.yml": "/etc/prometheus/web.yml",
	} {
		cfg, err := parse("test.toml", "/etc/streamd", "metrics.web_config_file = \""+file+"\"\n"+rest, ModeRun)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Metrics.WebConfigFile != want {
			t.Errorf("web_config_file %q loads as %q, want %q", file, cfg.Metrics.WebConfigFile, want)
		}
	}
}

func TestStateDirectory(t *testing.T) {
	const streams = `
[[stream]]
name = "s"
path = "/srv/s.ss"
[[subscription]]
name = "a"
stream = "s"
key = "k"
handler.kind = "discard"
`
	tests := []struct {
		name, env, src string
		mode           Mode
		want           string
	}{
		{"from the environment", "/var/lib/streamd", streams, ModeRun, "/var/lib/streamd"},
		{"first of several", "/var/lib/streamd:/var/lib/other", streams, ModeRun, "/var/lib/streamd"},
		{"the file wins", "/var/lib/streamd", `state_dir = "/srv/state"` + streams, ModeRun, "/srv/state"},
		{"relative to the file", "", `state_dir = "state"` + streams, ModeRun, "/etc/streamd/state"},
		{"not for a pipe", "/var/lib/streamd", "[[subscription]]\nname = \"a\"\nkey = \"k\"\nout_retry = \"r\"\nhandler.kind = \"discard\"\n", ModePipe, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("STATE_DIRECTORY", tc.env)
			cfg, err := parse("test.toml", "/etc/streamd", tc.src, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.StateDir != tc.want {
				t.Errorf("state dir %q, want %q", cfg.StateDir, tc.want)
			}
		})
	}
	t.Setenv("STATE_DIRECTORY", "streamd")
	_, err := parse("test.toml", "/etc/streamd", streams, ModeRun)
	if want := `test.toml: state_dir: $STATE_DIRECTORY "streamd" is not an absolute path`; err == nil || err.Error() != want {
		t.Errorf("relative $STATE_DIRECTORY: error %v, want %s", err, want)
	}
}

// TestRelativePaths checks that relative paths are taken from the
// directory of the configuration file, named by a relative path too.
func TestRelativePaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	const src = `
state_dir = "state"
[[stream]]
name = "s"
path = "../data/./s.ss"
[[subscription]]
name = "a"
stream = "s"
key = "k"
[subscription.handler]
kind = "http"
url = "https://example.org/"
bearer_token_file = "secrets/token"
ca_file = "/etc/ssl/ca.pem"
[[subscription]]
name = "b"
stream = "s"
key = "k"
handler = { kind = "exec", command = ["bin/handle", "data/x"] }
[[subscription]]
name = "c"
stream = "s"
key = "k"
handler = { kind = "exec", command = ["handle"] }
`
	if err := os.WriteFile(filepath.Join(dir, "etc", "streamd.toml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	cfg, err := Load("etc/streamd.toml", ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got, want string }{
		{"state_dir", cfg.StateDir, filepath.Join(dir, "etc", "state")},
		{"stream path", cfg.Streams[0].Path, filepath.Join(dir, "data", "s.ss")},
		{"bearer_token_file", cfg.Subscriptions[0].Handler.BearerTokenFile, filepath.Join(dir, "etc", "secrets", "token")},
		{"ca_file", cfg.Subscriptions[0].Handler.CAFile, "/etc/ssl/ca.pem"},
		{"command with a slash", cfg.Subscriptions[1].Handler.Command[0], filepath.Join(dir, "etc", "bin", "handle")},
		{"its argument", cfg.Subscriptions[1].Handler.Command[1], "data/x"},
		{"command from $PATH", cfg.Subscriptions[2].Handler.Command[0], "handle"},
	} {
		if c.got != c.want {
			t.Errorf("%s %q, want %q", c.what, c.got, c.want)
		}
	}
}

// TestKeysAreCaseSensitive checks the surprise STYLE.md warns of: the TOML
// decoder fills fields from keys that differ in case, and Load
// rejects them wherever they are.
func TestKeysAreCaseSensitive(t *testing.T) {
	var s Subscription
	if _, err := toml.Decode(`NAME = "x"`, &s); err != nil || s.Name != "x" {
		t.Logf("toml.Decode no longer matches NAME to name (Name %q, error %v)", s.Name, err)
	}
	const sub = "[[subscription]]\nname = \"a\"\nstream = \"s\"\nkey = \"k\"\n"
	for _, src := range []string{
		"STATE_DIR = \"/srv\"\n",
		"[Log]\nlevel = \"info\"\n",
		"[log]\nLevel = \"info\"\n",
		"[[Stream]]\nname = \"s\"\npath = \"/srv/s.ss\"\n",
		sub + "Handler = { kind = \"discard\" }\n",
		sub + "handler = { Kind = \"discard\" }\n",
		sub + "[subscription.handler]\nkind = \"exec\"\nCommand = [\"x\"]\n",
	} {
		_, err := parse("test.toml", "/etc/streamd", src, ModeRun)
		if err == nil || !strings.Contains(err.Error(), "keys are case-sensitive") {
			t.Errorf("config\n%s\nerror %v, want one saying keys are case-sensitive", src, err)
		}
	}
}

func TestDefaultConfigFile(t *testing.T) {
	t.Setenv("CONFIGURATION_DIRECTORY", "/run/conf:/etc/other")
	if got := DefaultFile(); got != "/run/conf/streamd.toml" {
		t.Errorf("with $CONFIGURATION_DIRECTORY: %q", got)
	}
	t.Setenv("CONFIGURATION_DIRECTORY", "")
	if got := DefaultFile(); got != "/etc/streamd/streamd.toml" {
		t.Errorf("without $CONFIGURATION_DIRECTORY: %q", got)
	}
}

// mustStart parses a start position for a table.
func mustStart(t *testing.T, s string) tail.Start {
	t.Helper()
	v, err := tail.ParseStart(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDuration(t *testing.T) {
	var d Duration
	if err := d.UnmarshalText([]byte("1h30m")); err != nil || d != Duration(90*time.Minute) || d.String() != "1h30m0s" {
		t.Errorf("1h30m: %v, %v", d, err)
	}
	for _, in := range []string{"", "5", "5 s", "1d"} {
		want := `invalid duration "` + in + `": write a number with a unit, as in "5s" or "2m"`
		if err := d.UnmarshalText([]byte(in)); err == nil || err.Error() != want {
			t.Errorf("%q: error %v, want %s", in, err, want)
		}
	}
}

func TestModeText(t *testing.T) {
	for _, m := range []Mode{ModeRun, ModePipe} {
		text, err := m.MarshalText()
		var back Mode
		if err != nil || back.UnmarshalText(text) != nil || back != m {
			t.Errorf("mode %v: %q, %v; read back as %v", m, text, err, back)
		}
	}
	var m Mode
	if err := m.UnmarshalText([]byte("daemon")); err == nil || !strings.Contains(err.Error(), "use run or pipe") {
		t.Errorf("UnmarshalText(daemon) = %v, want an error naming the modes", err)
	}
}

// TestBatchDefaults: batch_max_records turns batches on, in an http or a
// nats handler, and fills in the defaults of the other bounds; without it
// they stay unset.
func TestBatchDefaults(t *testing.T) {
	sub := func(name, handler, extra string) string {
		return fmt.Sprintf("[[subscription]]\nname = %q\nstream = \"s\"\nkey = \"k\"\n[subscription.handler]\n%s\n%s\n", name, handler, extra)
	}
	const http, nats = "kind = \"http\"\nurl = \"http://h/\"", "kind = \"nats\"\nurl = \"nats://h:4222\"\nsubject = \"s.{key}\""
	src := "state_dir = \"/s\"\n[[stream]]\nname = \"s\"\npath = \"/s.ss\"\n" +
		sub("http-batched", http, "batch_max_records = 500") + sub("http-single", http, "") +
		sub("nats-batched", nats, "batch_max_records = 500") + sub("nats-single", nats, "")
	cfg, err := parse("batch.toml", "/etc/streamd", src, ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	for i, sc := range cfg.Subscriptions {
		h := sc.Handler
		if i%2 == 0 && (h.BatchMaxRecords != 500 || h.BatchMaxBytes != DefaultBatchMaxBytes || h.BatchLinger != DefaultBatchLinger) {
			t.Errorf("%s: %d records, %d bytes, linger %s; want 500, the default bytes and linger", sc.Name, h.BatchMaxRecords, h.BatchMaxBytes, h.BatchLinger)
		}
		if i%2 == 1 && (h.BatchMaxRecords != 0 || h.BatchMaxBytes != 0 || h.BatchLinger != 0) {
			t.Errorf("%s: %d records, %d bytes, linger %s; want all unset", sc.Name, h.BatchMaxRecords, h.BatchMaxBytes, h.BatchLinger)
		}
	}
}

// TestStateDir: StateDir reads state_dir alone, as Load resolves it, from
// a file Load refuses for other reasons; without one it takes
// $STATE_DIRECTORY; a file it cannot read as TOML, or one naming no state
// directory, is an error.
func TestStateDir(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, text, env, want, err string
	}{
		{"absolute", "state_dir = \"/var/lib/streamd\"\nconcurrency = \"eight\"\n", "", "/var/lib/streamd", ""},
		{"relative", "state_dir = \"state\"\n[[stream]]\nnam = 1\n", "", filepath.Join(dir, "state"), ""},
		{"from systemd", "[metrics]\nlisten = 5\n", "/var/lib/streamd:/var/lib/other", "/var/lib/streamd", ""},
		{"the file's first", "state_dir = \"/srv/state\"\n", "/var/lib/streamd", "/srv/state", ""},
		{"none", "[metrics]\n", "", "", "no state_dir"},
		{"tilde", "state_dir = \"~/state\"\n", "", "", "no state_dir"},
		{"a key Load refuses", "State_Dir = \"/x\"\n", "/var/lib/streamd", "/var/lib/streamd", ""},
		{"not a string", "state_dir = 5\n", "/var/lib/streamd", "", "no state_dir"},
		{"cleaned", "state_dir = \"/a/b/../c/\"\n", "", "/a/c", ""},
		{"not TOML", "state_dir = \n", "", "", "streamd.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("STATE_DIRECTORY", tc.env)
			path := filepath.Join(dir, "streamd.toml")
			if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := StateDir(path)
			if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("StateDir = %q, %v; want %q, error with %q", got, err, tc.want, tc.err)
			}
		})
	}
}

// TestStreamHint: an unknown stream name is answered with the name meant,
// or the names there are, and the place of each [[stream]] table without
// a name, rather than "there is no [[stream]] table" when one is there.
func TestStreamHint(t *testing.T) {
	l := &loader{file: "f.toml", lines: lineMap{"stream[0]": 3, "stream[2]": 9}}
	unnamed := []keyPath{keyPath{}.k("stream").i(0)}
	both := append(unnamed, keyPath{}.k("stream").i(2))
	for _, tc := range []struct {
		name    string
		streams []string
		unnamed []keyPath
		want    string
	}{
		{"order", []string{"payments", "orders"}, unnamed, `; did you mean "orders"?`},
		{"billing", []string{"payments", "orders"}, nil, `; the streams are "orders", "payments"`},
		{"orders", nil, nil, "; there is no [[stream]] table"},
		{"orders", nil, unnamed, "; the [[stream]] table at f.toml:3 has no name: set its name"},
		{"orders", nil, both, "; the [[stream]] tables at f.toml:3 and f.toml:9 have no name: set their names"},
		{"billing", []string{"orders"}, unnamed, `; the streams are "orders"; the [[stream]] table at f.toml:3 has no name: set its name`},
	} {
		streams := map[string]keyPath{}
		for _, s := range tc.streams {
			streams[s] = keyPath{}
		}
		if got := l.streamHint(tc.name, streams, tc.unnamed); got != tc.want {
			t.Errorf("streamHint(%q, %q, %v) = %q, want %q", tc.name, tc.streams, tc.unnamed, got, tc.want)
		}
	}
}

// TestEnumValuesAnyCase: every key that takes one of a list of words takes
// it in any case, as [log] level and --log.level do, and is given it in
// lower case; a word not in the list is refused naming the list.
func TestEnumValuesAnyCase(t *testing.T) {
	const stream = "state_dir = \"/var/lib/streamd\"\n[[stream]]\nname = \"s\"\npath = \"/srv/s.ss\"\n"
	const sub = "[[subscription]]\nname = \"a\"\nkey = \"k\"\n"
	for _, tc := range []struct {
		name string
		mode Mode
		src  string
		got  func(*Config) string
		want string // the value loaded, or the error
	}{
		{"log.level", ModeRun, "log.level = \"WARN\"\n" + stream + sub + "stream = \"s\"\nhandler.kind = \"discard\"\n",
			func(c *Config) string { return c.Log.Level }, "warn"},
		{"log.format", ModeRun, "log.format = \"JSON\"\n" + stream + sub + "stream = \"s\"\nhandler.kind = \"discard\"\n",
			func(c *Config) string { return c.Log.Format }, "json"},
		{"log_unsupported", ModeRun, stream + sub + "stream = \"s\"\nlog_unsupported = \"OFF\"\nhandler.kind = \"discard\"\n",
			func(c *Config) string { return c.Subscriptions[0].LogUnsupported }, "off"},
		{"on_corrupt", ModeRun, stream + sub + "stream = \"s\"\non_corrupt = \"Stop\"\nhandler.kind = \"discard\"\n",
			func(c *Config) string { return c.Subscriptions[0].OnCorrupt }, "stop"},
		{"on_invalid", ModePipe, sub + "out_retry = \"k.retry\"\non_invalid = \"FAIL\"\nhandler.kind = \"discard\"\n",
			func(c *Config) string { return c.Subscriptions[0].OnInvalid }, "fail"},
		{"handler.format", ModeRun, stream + sub + "stream = \"s\"\nhandler.kind = \"stdout\"\nhandler.format = \"NDJSON\"\n",
			func(c *Config) string { return c.Subscriptions[0].Handler.Format }, "ndjson"},
		{"handler.kind", ModeRun, stream + sub + "stream = \"s\"\nhandler.kind = \"Exec\"\nhandler.command = [\"x\"]\n",
			func(c *Config) string { return c.Subscriptions[0].Handler.Kind }, "exec"},
		{"unknown", ModeRun, stream + sub + "stream = \"s\"\nlog_unsupported = \"Never\"\nhandler.kind = \"discard\"\n",
			nil, `test.toml:9: subscription[0].log_unsupported: unknown value "Never": use first, every or off`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse("test.toml", "/etc/streamd", tc.src, tc.mode)
			switch {
			case tc.got == nil && (err == nil || err.Error() != tc.want):
				t.Errorf("error %v, want %q", err, tc.want)
			case tc.got != nil && err != nil:
				t.Errorf("refused: %v", err)
			case tc.got != nil && tc.got(cfg) != tc.want:
				t.Errorf("loaded %q, want %q", tc.got(cfg), tc.want)
			}
		})
	}
}

// TestListenHost: the metrics listen host must be empty, an IP address or
// a host name; a mistyped address, which no lookup finds and on which run
// would stop, is refused at the key.
func TestListenHost(t *testing.T) {
	const rest = "state_dir = \"/var/lib/streamd\"\n[[stream]]\nname = \"s\"\npath = \"/srv/s.ss\"\n[[subscription]]\nname = \"a\"\nstream = \"s\"\nkey = \"k\"\nhandler.kind = \"discard\"\n"
	const refused = ": streamd could not listen there; write an address of this machine, as in 127.0.0.1:9464 or [::1]:9464, or its name"
	for _, tc := range []struct {
		listen string
		want   string // "" loads
	}{
		{":9464", ""},
		{"127.0.0.1:9464", ""},
		{"[::1]:9464", ""},
		{"[fe80::1%eth0]:9464", ""},
		{"localhost:9464", ""},
		{"metrics.example.org.:9464", ""},
		{"host_1:9464", ""},
		{"999.1.1.1:9464", `host "999.1.1.1" is neither an IP address nor a host name` + refused},
		{"10.0.0:9464", `host "10.0.0" is neither an IP address nor a host name` + refused},
		{"bad host:9464", `host "bad host" is neither an IP address nor a host name` + refused},
		{"-x.example:9464", `host "-x.example" is neither an IP address nor a host name` + refused},
		{"a..b:9464", `host "a..b" is neither an IP address nor a host name` + refused},
		{strings.Repeat("a", 64) + ".example:9464", `host "` + strings.Repeat("a", 64) + `.example" is neither an IP address nor a host name` + refused},
	} {
		t.Run(tc.listen, func(t *testing.T) {
			_, err := parse("test.toml", "/etc/streamd", rest+fmt.Sprintf("[metrics]\nlisten = %q\n", tc.listen), ModeRun)
			switch want := "test.toml:11: metrics.listen: " + tc.want; {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || err.Error() != want):
				t.Errorf("error:\n%v\nwant:\n%s", err, want)
			}
		})
	}
}
