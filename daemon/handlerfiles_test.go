package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/streamd/streamd/conf"
)

// TestHandlerFilesDigest: the digest of a handler's files changes with the
// content of a file it reads once, and with one appearing, but not with
// keys that name no file, nor with a file the nats client reads at each
// connection.
func TestHandlerFilesDigest(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string { return writeFile(t, dir, name, s) }
	token, ca := write("token", "one"), filepath.Join(dir, "ca.pem")
	web := conf.Handler{Kind: conf.HandlerHTTP, URL: "http://a.example", BearerTokenFile: token, CAFile: ca}
	password, creds := write("password", "secret"), write("user.creds", "jwt and seed")
	bus := conf.Handler{Kind: conf.HandlerNATS, URL: "nats://a.example", User: "u", PasswordFile: password, CredsFile: creds}

	missing := handlerFilesDigest(web)
	write("ca.pem", "certificate")
	first := handlerFilesDigest(web)
	if first == missing {
		t.Error("http: the digest is the same before and after ca_file appeared")
	}
	other := web
	other.URL, other.Timeout = "http://b.example", conf.Duration(1)
	if handlerFilesDigest(other) != first {
		t.Error("http: keys that name no file change the digest")
	}
	write("token", "two")
	if handlerFilesDigest(web) == first {
		t.Error("http: the digest is the same after bearer_token_file changed")
	}

	before := handlerFilesDigest(bus)
	write("user.creds", "rotated")
	if handlerFilesDigest(bus) != before {
		t.Error("nats: creds_file, which the client reads at each connection, changes the digest")
	}
	write("password", "rotated")
	if handlerFilesDigest(bus) == before {
		t.Error("nats: the digest is the same after password_file changed")
	}
}

// writeFile writes content to the file name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
