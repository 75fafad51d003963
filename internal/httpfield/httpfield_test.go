package httpfield

import (
	"strings"
	"testing"
)

func TestRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"name: token", ValidName("X-Tenant_1.a~"), true},
		{"name: empty", ValidName(""), false},
		{"name: space", ValidName("X Tenant"), false},
		{"name: colon", ValidName("X:Y"), false},
		{"name: non-ASCII", ValidName("X-Café"), false},
		{"value: text and tab", ValidValue("a b\tc"), true},
		{"value: empty", ValidValue(""), true},
		{"value: CR", ValidValue("a\rb"), false},
		{"value: DEL", ValidValue("a\x7f"), false},
		{"host: name and port", ValidHost("example.com:8080"), true},
		{"host: IPv6", ValidHost("[::1]:80"), true},
		{"host: empty", ValidHost(""), false},
		{"host: space", ValidHost("a b"), false},
		{"host: slash", ValidHost("a/b"), false},
		{"target: path and query", ValidRequestTarget("/a/b?c=d%20e"), true},
		{"target: space", ValidRequestTarget("/a b"), false},
		{"target: non-ASCII", ValidRequestTarget("/é"), false},
		{"token: letter", TokenByte('a'), true},
		{"token: bang", TokenByte('!'), true},
		{"token: slash", TokenByte('/'), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestReserved(t *testing.T) {
	for name, want := range map[string]string{
		"content-length":    "Content-Length is written by streamd's HTTP transport",
		"Transfer-Encoding": "Transfer-Encoding is written by streamd's HTTP transport",
		"streamd-seq":       "the Streamd- prefix is reserved",
		"X-Tenant":          "",
		"Content-Type":      "",
	} {
		got := Reserved(name)
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("Reserved(%q) = %q, want %q", name, got, want)
		}
	}
}
