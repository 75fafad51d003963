package conf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// addConfigSeeds adds the test and example configurations to f's corpus.
func addConfigSeeds(f *testing.F) {
	files, err := filepath.Glob("testdata/config/*.toml")
	if err != nil {
		f.Fatal(err)
	}
	examples, err := filepath.Glob("../configs/*.toml")
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range append(files, examples...) {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("x = [1, { a = 1 }, [{ b = 2 }, [{ c = 3 }]]]\ny = { z = [{ w = 1 }] }\n"))
	f.Add([]byte("[[a]]\n[[a.b]]\nc = 1\n[[a]]\n[[a.b]]\nc = 2\n[a.d]\ne = [{ f = 1 }]\n"))
	f.Add([]byte("\xef\xbb\xbfa = '''x'''''\r\nb = \"\"\"\\\r\n  y\"\"\"\r\n"))
}

// FuzzLoadConfig checks that no input makes the loader panic, that every
// line of an error names the file, and that what it accepts holds what
// validation promises.
func FuzzLoadConfig(f *testing.F) {
	addConfigSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, mode := range []Mode{ModeRun, ModePipe} {
			cfg, err := parse("fuzz.toml", "/etc/streamd", string(data), mode)
			if err != nil {
				_, isKey := errors.AsType[*keyError](err)
				_, isSyntax := errors.AsType[*syntaxError](err)
				if !isKey && !isSyntax {
					t.Fatalf("%s: error %v is neither about keys nor about syntax", mode, err)
				}
				for _, line := range strings.Split(err.Error(), "\n") {
					if !strings.HasPrefix(line, "fuzz.toml:") {
						t.Fatalf("%s: error line %q does not start with the file name", mode, line)
					}
				}
				continue
			}
			if len(cfg.Subscriptions) == 0 {
				t.Fatalf("%s: accepted with no subscription", mode)
			}
			for _, s := range cfg.Streams {
				if !filepath.IsAbs(s.Path) || s.BeaconInterval%1024 != 0 || s.PollInterval <= 0 {
					t.Fatalf("%s: accepted stream %+v", mode, s)
				}
			}
			for _, s := range cfg.Subscriptions {
				if s.Concurrency < 1 || s.Concurrency > maxConcurrency || len(s.Backoff) == 0 ||
					(s.MaxAttempts != nil && *s.MaxAttempts < 1) || (mode == ModePipe && s.OutRetry == "") {
					t.Fatalf("%s: accepted subscription %+v", mode, s)
				}
			}
		}
	})
}

// FuzzKeyLines checks the scan behind error line numbers against the TOML
// decoder: it finds each key the decoder lists, with a path in the decoded
// tree, on a line from the first after the longest prefix of whole lines
// that decodes without the key, to the first that decodes with it.
func FuzzKeyLines(f *testing.F) {
	addConfigSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		src := string(data)
		var tree map[string]any
		md, err := toml.Decode(src, &tree)
		if err != nil {
			return
		}
		keys := keyPaths(src, &md, tree)
		if len(keys) != len(md.Keys()) {
			t.Fatalf("scan found %d keys, the decoder %d", len(scanKeys(src)), len(md.Keys()))
		}
		for i, k := range keys {
			if k.path == nil {
				t.Fatalf("key %s: no path found in the tree", md.Keys()[i])
			}
		}
		if len(src) > 4096 {
			return // the prefixes cost O(n²)
		}
		lines := strings.SplitAfter(src, "\n")
		counts := make([]int, len(lines)+1) // keys in the first n lines, or -1 when they do not decode
		for n := range counts {
			var m map[string]any
			pmd, err := toml.Decode(strings.Join(lines[:n], ""), &m)
			counts[n] = len(pmd.Keys())
			if err != nil {
				counts[n] = -1
			}
		}
		for i, k := range keys {
			lo, hi := 0, len(lines)
			for n, c := range counts {
				if c >= 0 && c <= i {
					lo = n
				}
			}
			for n := len(counts) - 1; n >= 0; n-- {
				if counts[n] > i {
					hi = n
				}
			}
			if k.line <= lo || k.line > hi {
				t.Fatalf("key %s (%s) at line %d, want a line from %d to %d", md.Keys()[i], k.path, k.line, lo+1, hi)
			}
		}
	})
}
