package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestCommandLine runs the command line in process: help and version,
// per-command help, and the errors of a wrong command line.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		code      int
		out, errs []string // what stdout and stderr contain
		notOut    []string // what stdout must not contain
	}{
		{args: []string{"--version"}, out: []string{"streamd, version "}},
		{args: []string{"--help"}, out: []string{"usage: streamd", "check-config", "offsets show", "publish"}},
		{args: []string{"help", "run"}, out: []string{"usage: streamd run", "--config.file", "--log.level"}, notOut: []string{"--format"}},
		{args: []string{"offsets", "show", "--help"}, out: []string{"usage: streamd offsets show", "--config.file"}, notOut: []string{"--subscription", "--to"}},
		{args: []string{"decode", "-h"}, out: []string{"usage: streamd decode", "<FILE>", "follow", "--[no-]headers"}},
		{args: []string{"frobnicate"}, code: exitUsage, errs: []string{`streamd: unknown command "frobnicate"; see 'streamd --help'`}},
		{args: []string{"--config.file=x.toml", "offsets", "show"}, code: exitUsage,
			errs: []string{"streamd: flags go after the command: streamd offsets show --config.file=x.toml"}},
		{args: []string{"reload", "--timeout=0s"}, code: exitUsage, errs: []string{"streamd reload: --timeout=0s: want a positive duration"}},
		{args: []string{"publish", "--file="}, code: exitUsage, errs: []string{"streamd publish: --file is empty"}},
		{args: []string{"run", "--nope"}, code: exitUsage, errs: []string{"streamd run: unknown long flag '--nope'; see 'streamd run --help'"}},
		{args: []string{"offsets", "set", "--to=end"}, code: exitUsage, errs: []string{"streamd offsets set: required flag(s) '--subscription' not provided"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errs bytes.Buffer
			if code := run(tc.args, stdio{strings.NewReader(""), &out, &errs}); code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, errs.String())
			}
			for _, w := range tc.out {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notOut {
				if strings.Contains(out.String(), w) {
					t.Errorf("stdout has %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.errs {
				if !strings.Contains(errs.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, errs.String())
				}
			}
		})
	}
}

// TestManPageAndCompletions runs the binary (kingpin writes these to the
// process's stdout) for the man page and the completion scripts that make
// install installs: a title line roff reads, and each shell's script.
func TestManPageAndCompletions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag string
		want []string
	}{
		{"--help-man", []string{".TH STREAMD 1 \"\" \"streamd devel\" \"User Commands\"\n.SH \"NAME\"\nstreamd \\- Tails", ".SH \"COMMANDS\"", "offsets show"}},
		{"--completion-script-bash", []string{"complete -F _streamd_bash_autocomplete"}},
		{"--completion-script-zsh", []string{"#compdef streamd"}},
	} {
		r := runBinary(t, nil, tc.flag)
		if r.code != exitOK {
			t.Errorf("streamd %s: exit %d: %s", tc.flag, r.code, r.stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("streamd %s lacks %q:\n%.300s", tc.flag, w, r.stdout)
			}
		}
	}
}
