package failpoint

import (
	"bufio"
	"bytes"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    map[string]Arm
		wantErr string
	}{
		{"", map[string]Arm{}, ""},
		{"streamfile.append=3", map[string]Arm{StreamfileAppend: {Hit: 3}}, ""},
		{"streamfile.append=3, offsets.commit=5,", map[string]Arm{StreamfileAppend: {Hit: 3}, OffsetsCommit: {Hit: 5}}, ""},
		{"offsets.write=1,retrytimer.spool=40", map[string]Arm{OffsetsWrite: {Hit: 1}, RetrytimerSpool: {Hit: 40}}, ""},
		{"offsets.commit=2:hang", map[string]Arm{OffsetsCommit: {Hit: 2, Hang: true}}, ""},
		{"offsets.commit=hang", nil, "want a hit number of at least 1"},
		{"offsets.commit=2:stall", nil, "want a hit number of at least 1"},
		{"streamfile.append", nil, `"streamfile.append": want point=N`},
		{"streamfile.append=0", nil, "want a hit number of at least 1"},
		{"streamfile.append=x", nil, "want a hit number of at least 1"},
		{"nowhere=1", nil, `unknown point "nowhere"`},
		{"offsets.commit=1,offsets.commit=2", nil, `point "offsets.commit" armed twice`},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q) error %v, want one containing %q", tt.in, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("Parse(%q): %v", tt.in, err)
		case !maps.Equal(got, tt.want):
			t.Errorf("Parse(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// TestDisarmed checks that hooks do nothing in a process started without
// EnvVar (this one, unless it is the helper).
func TestDisarmed(t *testing.T) {
	if os.Getenv(EnvVar) != "" {
		t.Skip(EnvVar + " is set")
	}
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 100 {
		Hit(OffsetsCommit)
		TornWrite(StreamfileAppend, f, []byte("abc"), 0)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != 0 {
		t.Errorf("a disarmed TornWrite wrote to the file (%v, %v)", fi, err)
	}
}

// helperEnv makes TestHelperProcess play the process that kills itself.
const helperEnv = "FAILPOINT_TEST_FILE"

// TestHelperProcess writes "first" and then, through TornWrite, "second"
// and "third" to the file named by helperEnv, with each write's hook
// before it.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv(helperEnv)
	if path == "" {
		t.Skip("helper process of TestKill")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var off int64
	for _, s := range []string{"first|", "second|", "third|"} {
		Hit(OffsetsCommit)
		TornWrite(StreamfileAppend, f, []byte(s), off)
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
		off += int64(len(s))
	}
	os.Exit(0)
}

// TestKill runs the helper with points armed and checks that it dies of
// SIGKILL at the armed hit, with the prefix written for a TornWrite.
func TestKill(t *testing.T) {
	tests := []struct {
		arm      string
		want     []string // what the file may hold after the kill
		wantLine string
	}{
		{"streamfile.append=2", []string{"first|s", "first|se", "first|sec", "first|seco", "first|secon", "first|second"},
			"failpoint: streamfile.append: hit 2: wrote"},
		{"offsets.commit=3", []string{"first|second|"}, "failpoint: offsets.commit: hit 3: kill -9"},
		{"offsets.commit=2,streamfile.append=2", []string{"first|"}, "failpoint: offsets.commit: hit 2: kill -9"},
		{"offsets.commit=4", []string{"first|second|third|"}, ""}, // never reached: a clean exit
	}
	for _, tt := range tests {
		t.Run(tt.arm, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f")
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), helperEnv+"="+path, EnvVar+"="+tt.arm, "GORACE=atexit_sleep_ms=0")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			killed := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
			switch {
			case tt.wantLine == "" && err != nil:
				t.Fatalf("helper: %v, want a clean exit\n%s", err, stderr.Bytes())
			case tt.wantLine != "" && !killed:
				t.Fatalf("helper: %v, want death by SIGKILL\n%s", err, stderr.Bytes())
			case !strings.Contains(stderr.String(), tt.wantLine):
				t.Errorf("helper's stderr %q, want a line with %q", stderr.String(), tt.wantLine)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			ok := false
			for _, w := range tt.want {
				ok = ok || string(got) == w
			}
			if !ok {
				t.Errorf("file holds %q, want one of %q", got, tt.want)
			}
		})
	}
}

// TestBadSpec checks that a malformed EnvVar stops the process at start.
func TestBadSpec(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestDisarmed$", "-test.count=1")
	cmd.Env = append(os.Environ(), EnvVar+"=offsets.comit=1", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `unknown point "offsets.comit"`) {
		t.Errorf("with a bad %s: %v, output %q; want exit status 2 naming the point", EnvVar, err, out)
	}
}

// TestHang runs the helper with a point armed to hang: it stops at the
// armed hit, says so, and stays alive, having written what came before.
func TestHang(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+path, EnvVar+"=offsets.commit=2:hang", "GORACE=atexit_sleep_ms=0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || line != "failpoint: offsets.commit: hit 2: hang\n" {
		t.Fatalf("helper's first stderr line %q (%v), want the hang", line, err)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the helper is not alive after the hang: %v", err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "first|" {
		t.Errorf("file holds %q (%v), want the write before the hang only", got, err)
	}
}
