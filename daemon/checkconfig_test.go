package daemon

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/conf"
)

// TestConfigCheck: each check is made only when asked, each finding lands
// in its own field, and an unknown --user stops the check before the file
// is read.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string { return writeFile(t, dir, name, src) }
	// The stream file is missing and may not be created, and the exec
	// command does not exist: both only show when checked.
	unusable := write("unusable.toml", `state_dir = "state"
stream = [{ name = "orders", path = "orders.ss", create = false }]

[[subscription]]
name = "jobs"
stream = "orders"
key = "jobs"
handler = { kind = "exec", command = ["/nonexistent/run-job"] }
`)
	stage := write("pipe.toml", "[[subscription]]\nname = \"jobs\"\nkey = \"jobs\"\nout_retry = \"jobs.retry\"\nhandler.kind = \"discard\"\n")
	invalid := write("invalid.toml", "[[subscription]]\nname = \"jobs\"\nkey = \"a b\"\nout_retry = \"jobs.retry\"\nhandler.kind = \"discard\"\n")
	// Two streams on one file, the second through a symlink.
	write("s.ss", "")
	if err := os.Symlink("s.ss", filepath.Join(dir, "link.ss")); err != nil {
		t.Fatal(err)
	}
	shared := write("shared.toml", `state_dir = "state"
stream = [{ name = "s", path = "s.ss" }, { name = "t", path = "link.ss" }]

[[subscription]]
name = "jobs"
stream = "s"
key = "jobs"
handler.kind = "discard"
`)
	missing := filepath.Join(dir, "none.toml")
	me := currentAccount().Name
	for _, tc := range []struct {
		name                  string
		check                 ConfigCheck
		err                   string // Run's error, "" for none
		account               string
		load, files, handlers string // what each error begins with, "" for nil
		unreadable            bool   // Load is a *fs.PathError
	}{
		{name: "loads", check: ConfigCheck{Path: unusable, Mode: conf.ModeRun}, account: me},
		{name: "files", check: ConfigCheck{Path: unusable, Mode: conf.ModeRun, Files: true}, account: me,
			files: `stream "orders": stat ` + filepath.Join(dir, "orders.ss") + ": no such file or directory (create = false"},
		{name: "streams on one file", check: ConfigCheck{Path: shared, Mode: conf.ModeRun, Files: true}, account: me,
			files: `stream "t": ` + filepath.Join(dir, "link.ss") + ` is the file of stream "s" too (path ` + filepath.Join(dir, "s.ss") + ")"},
		{name: "no files in a pipe stage", check: ConfigCheck{Path: stage, Mode: conf.ModePipe, Files: true}, account: me},
		{name: "handlers", check: ConfigCheck{Path: unusable, Mode: conf.ModeRun, Handlers: true}, account: me,
			handlers: unusable + `:8: subscription "jobs": exec handler: command: exec: "/nonexistent/run-job"`},
		{name: "user", check: ConfigCheck{Path: unusable, Mode: conf.ModeRun, User: "root"}, account: "root"},
		{name: "unknown user", check: ConfigCheck{Path: missing, Mode: conf.ModeRun, User: "no-such-user-here"},
			err: `user "no-such-user-here": user: unknown user no-such-user-here`},
		{name: "invalid", check: ConfigCheck{Path: invalid, Mode: conf.ModePipe, Files: true, Handlers: true}, account: me,
			load: invalid + `:3: subscription[0].key: stream key "a b"`},
		{name: "unreadable", check: ConfigCheck{Path: missing, Mode: conf.ModeRun, Files: true, Handlers: true}, account: me,
			load: "open " + missing + ": no such file or directory", unreadable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.check.Run()
			if !hasPrefix(err, tc.err) {
				t.Fatalf("Run: error %v, want %q", err, tc.err)
			}
			if err != nil {
				return
			}
			if r.Account.Name != tc.account {
				t.Errorf("account %q, want %q", r.Account.Name, tc.account)
			}
			for _, f := range []struct {
				field string
				got   error
				want  string
			}{{"Load", r.Load, tc.load}, {"Files", r.Files, tc.files}, {"Handlers", r.Handlers, tc.handlers}} {
				if !hasPrefix(f.got, f.want) {
					t.Errorf("%s: %v, want %q", f.field, f.got, f.want)
				}
			}
			if _, ok := errors.AsType[*fs.PathError](r.Load); ok != tc.unreadable {
				t.Errorf("Load %v is a *fs.PathError: %v, want %v", r.Load, ok, tc.unreadable)
			}
		})
	}
}

// TestCheckListen: check-config --handlers resolves the host of the
// metrics listen address as run does before it listens, and says at the
// key why run could not listen there; the resolver is a fake.
func TestCheckListen(t *testing.T) {
	dir := t.TempDir()
	rest := "state_dir = \"state\"\n[[stream]]\nname = \"orders\"\npath = \"orders.ss\"\n[[subscription]]\nname = \"jobs\"\nstream = \"orders\"\nkey = \"jobs\"\nhandler.kind = \"discard\"\n"
	notFound := &net.DNSError{Err: "no such host", Name: "metrics.invalid", IsNotFound: true}
	const fix = ": streamd run could not listen there; use an address of this machine, as in 127.0.0.1:9464, or a name that resolves to one"
	for _, tc := range []struct {
		name    string
		metrics string // the [metrics] table, "" for none
		err     error  // what the fake resolver answers
		asked   string // the address resolved, "" for none
		want    string // the error, after the file's path; "" for nil
	}{
		{"resolves", "[metrics]\nlisten = \"metrics.example:9464\"\n", nil, "metrics.example:9464", ""},
		{"no listener", "[metrics]\nlisten = \"\"\n", notFound, "", ""},
		{"not found", "[metrics]\nlisten = \"metrics.invalid:9464\"\n", notFound, "metrics.invalid:9464", ":11: metrics.listen: lookup metrics.invalid: no such host" + fix},
		{"the default", "", notFound, "127.0.0.1:9464", "metrics.listen: lookup metrics.invalid: no such host" + fix},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, dir, "streamd.toml", rest+tc.metrics)
			cfg, err := conf.Load(path, conf.ModeRun)
			if err != nil {
				t.Fatal(err)
			}
			var asked string
			err = checkListen(cfg, func(network, addr string) (*net.TCPAddr, error) {
				asked = addr
				return nil, tc.err
			})
			if asked != tc.asked {
				t.Errorf("resolved %q, want %q", asked, tc.asked)
			}
			want := tc.want
			if strings.HasPrefix(want, ":") {
				want = path + want
			}
			if !hasPrefix(err, want) || err != nil && err.Error() != want {
				t.Errorf("error:\n%v\nwant:\n%s", err, want)
			}
			if tc.err != nil && err != nil && !errors.Is(err, tc.err) {
				t.Errorf("error %v does not wrap %v", err, tc.err)
			}
		})
	}
}

// hasPrefix reports whether err is nil and want "", or err's message
// begins with a non-empty want.
func hasPrefix(err error, want string) bool {
	if err == nil || want == "" {
		return err == nil && want == ""
	}
	return strings.HasPrefix(err.Error(), want)
}

// TestConfigReportPrint: a file that serves is said valid on stdout; a
// file that does not load is said invalid with its problems, and a valid
// one that cannot serve here says what stops it, each finding on stderr.
func TestConfigReportPrint(t *testing.T) {
	const path = "/etc/streamd/streamd.toml"
	for _, tc := range []struct {
		name        string
		report      ConfigReport
		serves      bool
		out, errOut string
	}{
		{name: "valid", report: ConfigReport{Account: Account{Name: "streamd"}}, serves: true,
			out: "streamd: configuration file /etc/streamd/streamd.toml is valid\n"},
		{name: "invalid", report: ConfigReport{Load: errors.New("streamd.toml:3: subscription[0].key: bad")},
			errOut: "streamd: configuration file /etc/streamd/streamd.toml is invalid:\nstreamd.toml:3: subscription[0].key: bad\n"},
		{name: "files", report: ConfigReport{Account: Account{Name: "streamd"}, Files: errors.New(`stream "orders": no access`)},
			errOut: "streamd: configuration file /etc/streamd/streamd.toml is valid, but streamd run cannot use its files as user streamd:\nstream \"orders\": no access\n"},
		{name: "handlers", report: ConfigReport{Handlers: errors.New(`subscription "jobs": no command`)},
			errOut: "streamd: configuration file /etc/streamd/streamd.toml is valid, but it cannot start here:\nsubscription \"jobs\": no command\n"},
		{name: "files and handlers", report: ConfigReport{Account: Account{Name: "streamd"}, Files: errors.New("no access"), Handlers: errors.New("no command")},
			errOut: "streamd: configuration file /etc/streamd/streamd.toml is valid, but streamd run cannot use its files as user streamd:\nno access\n" +
				"streamd: configuration file /etc/streamd/streamd.toml is valid, but it cannot start here:\nno command\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			if serves := tc.report.Print(&out, &errOut, path); serves != tc.serves {
				t.Errorf("Print reported %v, want %v", serves, tc.serves)
			}
			if out.String() != tc.out || errOut.String() != tc.errOut {
				t.Errorf("stdout %q, stderr %q; want %q, %q", out.String(), errOut.String(), tc.out, tc.errOut)
			}
		})
	}
}
