package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPublishReservedKey: a line or --key naming a key the format reserves
// (the end-of-stream mark's, the wildcard's) is refused with the key named,
// and nothing of the run after the line before it is written: an
// end-of-stream frame in the middle would hide every later record.
func TestPublishReservedKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, stdin, key string
		args             []string
		code             int
	}{
		{"eos line", "[a] one\n[SEA_STREAMER_INTERNAL] EOS\n[a] two\n", "SEA_STREAMER_INTERNAL", nil, exitError},
		{"wildcard line", "[a] one\n[SEA_STREAMER_WILDCARD] x\n[a] two\n", "SEA_STREAMER_WILDCARD", nil, exitError},
		{"eos flag", "one\n", "SEA_STREAMER_INTERNAL", []string{"--key=SEA_STREAMER_INTERNAL"}, exitUsage},
		{"wildcard flag", "one\n", "SEA_STREAMER_WILDCARD", []string{"--key=SEA_STREAMER_WILDCARD"}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".ss")
			runBinaryOK(t, "zero", "publish", "--file="+path, "--key=a")
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			r := runBinary(t, []byte(tc.stdin), append([]string{"publish", "--file=" + path}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.key) || !strings.Contains(r.stderr, "reserved") {
				t.Fatalf("exit %d, stderr %q; want exit %d naming reserved key %s", r.code, r.stderr, tc.code, tc.key)
			}
			for _, f := range readFile(t, path) {
				if f.Key != "a" || string(f.Payload) != "zero" && string(f.Payload) != "one" {
					t.Fatalf("record %s %q was written; want only the records before the refused line", f.Key, f.Payload)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.HasPrefix(after, before) {
				t.Fatal("the records already in the file changed")
			}
		})
	}
}
