package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const vectorDir = "../../testdata/streamfile"

// TestDecodeVectorsNDJSON runs the binary on every stream file vector: the
// output equals the expected file byte for byte, with the documented exit code.
func TestDecodeVectorsNDJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		code int
	}{
		{"sample-1", exitOK}, {"consumer", exitOK}, {"quicksort", exitOK}, {"edge-a-spliced", exitOK},
		{"edge-b-truncated", exitOK}, {"edge-c-badcrc", exitError}, {"edge-d-eos", exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want, err := os.ReadFile(filepath.Join(vectorDir, tc.name+".expected.ndjson"))
			if err != nil {
				t.Fatal(err)
			}
			r := runBinary(t, nil, "decode", "--format=ndjson", filepath.Join(vectorDir, tc.name+".ss"))
			if r.stdout != string(want) {
				t.Errorf("stdout differs from %s.expected.ndjson:\n%s", tc.name, firstDiff(r.stdout, string(want)))
			}
			if r.code != tc.code {
				t.Errorf("exit code %d, want %d (stderr: %s)", r.code, tc.code, r.stderr)
			}
		})
	}
}

func firstDiff(got, want string) string {
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			return "line " + strconv.Itoa(i+1) + ":\n got  " + g + "\n want " + w
		}
	}
	return ""
}

func TestDecodeLogFormat(t *testing.T) {
	t.Parallel()
	r := runBinary(t, nil, "decode", filepath.Join(vectorDir, "consumer.ss"))
	if r.code != exitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	for _, want := range []string{
		`# header: file_name="consumer-1691686154741" created_at=2023-08-10T16:49:14.742Z beacon_interval=1024`,
		`[2023-08-10T16:49:14.745 | hello | 0 | 1] hello-0`,
		`# beacon at 1024: remaining=39 markers=1 [hello | 20 | 1 | 1691686154773 | 2887]`,
	} {
		found := false
		for _, l := range lines {
			found = found || l == want
		}
		if !found {
			t.Errorf("output has no line %q", want)
		}
	}
	// The beacon at 1024 interrupts the frame of seq 20: it is printed after it.
	idx := func(prefix string) int {
		for i, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return i
			}
		}
		return -1
	}
	if a, b := idx("[2023-08-10T16:49:14.773 | hello | 20 |"), idx("# beacon at 1024"); a < 0 || b != a+1 {
		t.Errorf("beacon at 1024 is line %d, want right after the frame it interrupts (line %d)", b, a)
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notSS, v2 := badStreamFiles(t, dir)
	short := filepath.Join(dir, "short.ss")
	b, _ := os.ReadFile(filepath.Join(vectorDir, "sample-1.ss"))
	os.WriteFile(short, b[:100], 0o644)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"wrong magic", []string{"decode", notSS}, exitError, "not a stream file: magic bytes are 0x78 0x78"},
		{"wrong version", []string{"decode", v2}, exitError, "unsupported format version 2, want 1"},
		{"short header", []string{"decode", short}, exitError, "shorter than the 128-byte header"},
		{"missing file", []string{"decode", filepath.Join(dir, "nope.ss")}, exitUsage, "no such file or directory"},
		{"a directory, named once", []string{"decode", dir}, exitUsage, "streamd decode: open " + dir + ": is a directory\n"},
		{"no file", []string{"decode"}, exitUsage, "streamd decode: required argument 'FILE' not provided; see 'streamd decode --help'"},
		{"bad format", []string{"decode", "--format=xml", notSS}, exitUsage, `streamd decode: unknown format "xml": use log or ndjson`},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBinary(t, nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
}

// TestDecodeReaderGone: a decode whose reader goes away before the end
// (streamd decode FILE | head -1) ends quietly with 0, through a real pipe;
// one whose output fails otherwise (a full disk) says so, with 1.
func TestDecodeReaderGone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "many.ss")
	if r := runBinary(t, []byte(strings.Repeat("a record of some length\n", 4000)), "publish", "--file="+path, "--key=k"); r.code != exitOK {
		t.Fatalf("publish: exit %d: %s", r.code, r.stderr)
	}
	for _, format := range []string{"log", "ndjson"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(streamdBinary(t), "decode", "--format="+format, path)
			var errs bytes.Buffer
			cmd.Stderr = &errs
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			out.Close()
			if err := cmd.Wait(); err != nil || errs.Len() > 0 {
				t.Fatalf("decode into a pipe closed after a line: %v, stderr %q; want exit 0 and nothing said", err, errs.String())
			}
		})
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skip(err)
	}
	defer full.Close()
	cmd := exec.Command(streamdBinary(t), "decode", path)
	var errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = full, &errs
	err = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != exitError || !strings.Contains(errs.String(), "no space left on device") {
		t.Fatalf("decode onto a full disk: %v, stderr %q; want exit %d and the reason", err, errs.String(), exitError)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := runBinary(t, nil, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "streamd, version ") || !strings.Contains(r.stdout, "go1.") {
		t.Fatalf("version: exit %d, stdout %q", r.code, r.stdout)
	}
}

// TestDecodeHeaders publishes a record with a header, lets a handler ask
// for a retry once, and decodes the file with --headers: the demo record
// shows its source header, the retry copy its x-ruststream-retry-count,
// each with the payload inside the envelope, in both formats.
func TestDecodeHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSub("billing", "max_attempts = 3", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo outcome=retry; fi`))
	if r := runBinary(t, []byte(`{"id":1,"item":"tea"}`+"\n"), "publish", "--file="+e.stream, "--key=orders", "--header=source=make-run"); r.code != 0 {
		t.Fatalf("publish: exit %d: %s", r.code, r.stderr)
	}
	p := e.start()
	eventually(t, 10*time.Second, "the retry copy delivered", func() bool { return len(e.deliveries()) == 2 })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	r := runBinary(t, nil, "decode", "--headers", e.stream)
	if r.code != exitOK {
		t.Fatalf("decode --headers: exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		" | orders | 1 | 0] {\"id\":1,\"item\":\"tea\"}\n#   source: make-run\n",
		" | orders | 2 | 0] {\"id\":1,\"item\":\"tea\"}\n#   source: make-run\n#   stream-sequence: 1\n#   x-ruststream-retry-count: 1\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("decode --headers has no %q:\n%s", want, r.stdout)
		}
	}
	// The flag after the argument, as any flag may be.
	r = runBinary(t, nil, "decode", e.stream, "--format=ndjson", "--headers")
	if r.code != exitOK {
		t.Fatalf("decode --format=ndjson --headers: exit %d: %s", r.code, r.stderr)
	}
	payload := base64.StdEncoding.EncodeToString([]byte(`{"id":1,"item":"tea"}`))
	for _, want := range []string{
		`"seq":1,"timestamp_ms":`,
		`"headers":{"source":"make-run"},"payload_b64":"` + payload + `"`,
		`"headers":{"source":"make-run","stream-sequence":"1","x-ruststream-retry-count":"1","x-streamd-origin":"billing"},"payload_b64":"` + payload + `"`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("decode --format=ndjson --headers has no %q:\n%s", want, r.stdout)
		}
	}
}
