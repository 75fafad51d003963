package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
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

// failingWriter fails every write with err, as a closed stdout (EPIPE)
// or one on a full disk (ENOSPC) does.
type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: f.err}
}

// TestOutputFailed: help and version written to a stdout that fails end
// quietly with 0 when the reader went away (streamd --help | head -1),
// else with 1 and the reason, never with kingpin's panic.
func TestOutputFailed(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"publish", "--help"}, {"help", "run"}, {"--version"}, {"version"}} {
		for _, tc := range []struct {
			err  syscall.Errno
			code int
			errs string
		}{
			{syscall.EPIPE, exitOK, ""},
			{syscall.ENOSPC, exitError, "streamd: cannot write the output: write /dev/stdout: no space left on device\n"},
		} {
			t.Run(strings.Join(args, " ")+"/"+tc.err.Error(), func(t *testing.T) {
				var errs bytes.Buffer
				if code := run(args, stdio{strings.NewReader(""), failingWriter{tc.err}, &errs}); code != tc.code || errs.String() != tc.errs {
					t.Errorf("exit %d, stderr %q; want exit %d, stderr %q", code, errs.String(), tc.code, tc.errs)
				}
			})
		}
	}
	// kingpin writes the man page to the process's stdout: a full disk.
	t.Run("--help-man", func(t *testing.T) {
		full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
		if err != nil {
			t.Skip(err)
		}
		defer full.Close()
		cmd := exec.Command(streamdBinary(t), "--help-man")
		var errs bytes.Buffer
		cmd.Stdout, cmd.Stderr = full, &errs
		err = cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitError || !strings.Contains(errs.String(), "cannot write the output") {
			t.Errorf("streamd --help-man >/dev/full: %v, stderr %q; want exit 1 saying why", err, errs.String())
		}
	})
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
	// What the completion scripts ask: the words after streamd, the last
	// one being completed (empty at a space); kingpin answered nothing for
	// the command word.
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{""}, "run pipe check-config reload decode publish repair version offsets"},
		{[]string{"de"}, "decode"},
		{[]string{"offsets"}, "offsets"},
		{[]string{"offsets", ""}, "show set"},
		{[]string{"decode", "--fo"}, "--format --headers --follow"}, // the scripts keep those that match
	} {
		r := runBinary(t, nil, append([]string{"--completion-bash"}, tc.words...)...)
		if got := strings.Join(strings.Fields(r.stdout), " "); r.code != exitOK || !strings.HasPrefix(got, tc.want) {
			t.Errorf("streamd --completion-bash %q: exit %d, %q; want %q", tc.words, r.code, got, tc.want)
		}
	}
}
