package conf

import (
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// TestLineMap checks the line found for keys in each kind of TOML
// construct, and for values that are not keys (array elements, missing keys).
func TestLineMap(t *testing.T) {
	const doc = `# a comment = not a key
a = 1
s = """
x = 1 # inside a string
"""
[t]
b = [
  1, # = in a comment
  2,
]
c = { d = 1, e = { f = "=" } }
"quoted key" = 'lit=eral'
[[arr]]
g = '''
multi = '''
h.i = 2
[arr.sub]
j = "q\"="
[[arr]]
[[arr.list]]
k = 1
[[arr.list]]
k = 2
inl = [ 1, { m = 1 }, [ { n = 1 }, { n = 2 } ] ]
tbl = { list = [ { o = 1 }, { o = 2 } ] }
`
	want := map[string]int{
		"a":                            2,
		"s":                            3,
		"t":                            6,
		"t.b":                          7,
		"t.b[1]":                       7, // an element: its array's line
		"t.c":                          11,
		"t.c.e.f":                      11,
		`t."quoted key"`:               12,
		"arr":                          13,
		"arr[0]":                       13,
		"arr[0].g":                     14,
		"arr[0].h.i":                   16,
		"arr[0].h":                     16,
		"arr[0].sub.j":                 18,
		"arr[1]":                       19,
		"arr[1].list[0].k":             21,
		"arr[1].list[1].k":             23,
		"arr[1].list[1].inl[1]":        24,
		"arr[1].list[1].inl[1].m":      24,
		"arr[1].list[1].inl[2][1].n":   24,
		"arr[1].list[1].tbl.list[1].o": 25,
		"arr[1].list[1].missing":       22,
		"missing":                      0,
	}
	lines := lineMapOf(t, doc)
	for path, line := range want {
		if got := lines.line(parsePath(path)); got != line {
			t.Errorf("line of %s = %d, want %d", path, got, line)
		}
	}
}

// TestLineMapForms checks the scan on line ends, a byte order mark and
// inline tables over several lines (TOML 1.1).
func TestLineMapForms(t *testing.T) {
	for _, tc := range []struct {
		name, doc, path string
		line            int
	}{
		{"crlf", "a = 1\r\n[t]\r\nb = \"\"\"x\r\ny\"\"\"\r\nc = 2\r\n", "t.c", 5},
		{"bom", "\xef\xbb\xbf[t]\nb = 1\n", "t.b", 2},
		{"multi-line inline table", "x = {\n  y = 1,\n  z = [\n    { w = 1 },\n  ],\n}\n", "x.z[0].w", 4},
		{"quotes ending a string", "a = \"\"\"x\"\"\"\"\"\nb = '''y'''''\nc = 1\n", "c", 3},
		{"line-ending backslash", "a = \"\"\"x \\\n  y\"\"\"\nb = 1\n", "b", 3},
		{"array of inline tables", "subscription = [\n  { name = \"a\" },\n  { name = \"b\" },\n]\n", "subscription[1].name", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lineMapOf(t, tc.doc).line(parsePath(tc.path)); got != tc.line {
				t.Errorf("line of %s = %d, want %d", tc.path, got, tc.line)
			}
		})
	}
}

func lineMapOf(t *testing.T, doc string) lineMap {
	t.Helper()
	var tree map[string]any
	md, err := toml.Decode(doc, &tree)
	if err != nil {
		t.Fatal(err)
	}
	if n, m := len(scanKeys(doc)), len(md.Keys()); n != m {
		t.Fatalf("scan found %d keys, the decoder %d", n, m)
	}
	return newLineMap(doc, &md, tree)
}

// parsePath reads a path as keyPath.String writes it, for bare and simple
// quoted keys.
func parsePath(s string) keyPath {
	var p keyPath
	for s != "" {
		switch {
		case s[0] == '.':
			s = s[1:]
		case s[0] == '[':
			end := strings.IndexByte(s, ']')
			n := 0
			for _, c := range s[1:end] {
				n = n*10 + int(c-'0')
			}
			p, s = p.i(n), s[end+1:]
		case s[0] == '"':
			end := strings.IndexByte(s[1:], '"') + 1
			p, s = p.k(s[1:end]), s[end+1:]
		default:
			end := strings.IndexAny(s, ".[")
			if end < 0 {
				end = len(s)
			}
			p, s = p.k(s[:end]), s[end:]
		}
	}
	return p
}

func TestKeyPathString(t *testing.T) {
	p := keyPath{}.k("subscription").i(1).k("handler").k("headers").k("X Tenant")
	if got, want := p.String(), `subscription[1].handler.headers."X Tenant"`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	if got := parsePath(p.String()).String(); got != p.String() {
		t.Errorf("parsePath(%s) = %s", p, got)
	}
}

// TestHandlerPlace checks where a handler option is found for messages
// about it: its own line, else its handler table's, else the file's name.
func TestHandlerPlace(t *testing.T) {
	const src = `state_dir = "/var/lib/streamd"
[[stream]]
name = "orders"
path = "/var/lib/seastreamer/orders.ss"

[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
[subscription.handler]
kind = "http"
url = "https://billing.example/orders"
ca_file = "ca.pem"

[[subscription]]
name = "jobs"
stream = "orders"
key = "jobs"
handler.kind = "exec"
handler.command = ["run-job"]
`
	cfg, err := parse("streamd.toml", "/etc/streamd", src, ModeRun)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ subscription, option, want string }{
		{"billing", "ca_file", "streamd.toml:13"},
		{"billing", "url", "streamd.toml:12"},
		{"billing", "bearer_token_file", "streamd.toml:10"}, // not written: its table
		{"billing", "", "streamd.toml:10"},
		{"jobs", "command", "streamd.toml:20"},
		{"jobs", "timeout", "streamd.toml:19"}, // the dotted table's first key
		{"none", "url", "streamd.toml"},
	} {
		if got := cfg.HandlerPlace(tc.subscription, tc.option); got != tc.want {
			t.Errorf("HandlerPlace(%q, %q) = %q, want %q", tc.subscription, tc.option, got, tc.want)
		}
	}
	if got := (&Config{Subscriptions: cfg.Subscriptions}).HandlerPlace("billing", "url"); got != "" {
		t.Errorf("HandlerPlace of a Config not loaded = %q, want \"\"", got)
	}
}
