package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/streamd/streamd/conf"
)

// TestHandlerFilesDigest: the digest of a handler's files changes with the
// content of any of them, and with a file appearing or going, but not with
// keys that name no file.
func TestHandlerFilesDigest(t *testing.T) {
	dir := t.TempDir()
	token, ca := filepath.Join(dir, "token"), filepath.Join(dir, "ca.pem")
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(token, "one")
	h := conf.Handler{Kind: conf.HandlerHTTP, URL: "http://a.example", BearerTokenFile: token, CAFile: ca}
	missing := handlerFilesDigest(h)
	write(ca, "certificate")
	first := handlerFilesDigest(h)
	other := h
	other.URL, other.Timeout = "http://b.example", conf.Duration(1)
	write(token, "two")
	second := handlerFilesDigest(h)
	switch {
	case first == missing:
		t.Error("the digest is the same before and after ca_file appeared")
	case handlerFilesDigest(other) != second:
		t.Error("keys that name no file change the digest")
	case first == second:
		t.Error("the digest is the same after bearer_token_file changed")
	case handlerFilesDigest(conf.Handler{Kind: conf.HandlerDiscard}) != handlerFilesDigest(conf.Handler{Kind: conf.HandlerExec}):
		t.Error("handlers without files differ")
	}
}
