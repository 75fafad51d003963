package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// TestDecodeFollow runs `streamd decode --follow --format=ndjson` on a file,
// appends to it, and expects the lines a plain decode prints for the same
// file, as they are written. It ends by SIGTERM, at the end-of-stream
// frame, and when its reader goes away while the file is quiet (as with
// `| head -1`), each with exit code 0.
func TestDecodeFollow(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"sigterm", "eos", "reader gone"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "follow.ss")
			sw, err := streamfile.OpenWriter(path, streamfile.CreateOptions{Create: true,
				Header: streamfile.Header{FileName: "follow.ss", CreatedAtMs: 1694767177437, BeaconInterval: streamfile.DefaultBeaconInterval}})
			if err != nil {
				t.Fatal(err)
			}
			defer sw.Close()
			publish := func(payloads ...string) {
				t.Helper()
				fs := make([]streamfile.Frame, len(payloads))
				for i, p := range payloads {
					fs[i] = streamfile.Frame{Key: "orders", TimestampMs: 1694767177500, Payload: []byte(p)}
				}
				if err := sw.Publish(fs); err != nil {
					t.Fatal(err)
				}
			}
			publish(`{"id":1}`, `{"id":2}`, `{"id":3}`)

			cmd := exec.Command(streamdBinary(t), "decode", "--follow", "--format=ndjson", path)
			// Under -race, a process sleeps a second at exit by default.
			cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
			stdout, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdout.Close()
			cmd.Stdout = w
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err = cmd.Start()
			w.Close()
			if err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			lines := make(chan string, 100)
			go func() {
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			var printed []string
			expect := func() {
				t.Helper()
				want := decodeNDJSON(t, path)
				deadline := time.After(30 * time.Second)
				for len(printed) < len(want) {
					select {
					case l, ok := <-lines:
						if !ok {
							t.Fatalf("output ended after %d lines; stderr: %s", len(printed), stderr.String())
						}
						printed = append(printed, l)
					case <-deadline:
						t.Fatalf("printed %d lines, want %d", len(printed), len(want))
					}
				}
				if got := strings.Join(printed, "\n"); got != strings.Join(want, "\n") {
					t.Fatalf("follow printed\n%s\nwant\n%s", got, strings.Join(want, "\n"))
				}
			}
			expect()
			publish(`{"id":4}`)
			publish(`{"id":5}`, `{"id":6}`)
			expect()
			switch end {
			case "eos":
				if err := sw.Append(streamfile.Frame{Key: streamfile.EOSKey, TimestampMs: 1694767178000, Payload: []byte(streamfile.EOSPayload)}); err != nil {
					t.Fatal(err)
				}
				expect()
			case "sigterm":
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			case "reader gone":
				stdout.Close()
			}
			done := make(chan error, 1)
			go func() {
				for range lines {
				}
				done <- cmd.Wait()
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("exit: %v; stderr: %s", err, stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatal("streamd decode --follow did not end")
			}
			if stderr.Len() > 0 {
				t.Errorf("stderr: %s", stderr.String())
			}
		})
	}
}

// decodeNDJSON returns the lines a plain `decode --format=ndjson` prints
// for the file at path.
func decodeNDJSON(t *testing.T, path string) []string {
	t.Helper()
	var b bytes.Buffer
	if _, _, err := streamfile.FormatNDJSON.PrintFile(&b, path); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}
