package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestParseMedians(t *testing.T) {
	out := `goos: linux
pkg: example/streamfile
cpu: Test CPU
BenchmarkDecode/payload=64KiB-2   10  100 ns/op  900.0 MB/s  0.01 allocs/record
BenchmarkDecode/payload=64KiB-2   10  100 ns/op  1000 MB/s  0.01 allocs/record
BenchmarkDecode/payload=64KiB-2   10  100 ns/op  800 MB/s  0.01 allocs/record
BenchmarkCRC/payload=64KiB-2      10  100 ns/op  1000 MB/s
PASS
`
	f, cpu, warnings, err := parse(strings.NewReader(out))
	if err != nil || cpu != "Test CPU" || len(warnings) != 0 {
		t.Fatalf("cpu %q, warnings %q, err %v", cpu, warnings, err)
	}
	if v, ok := f.median("BenchmarkDecode/payload=64KiB", "MB/s"); !ok || v != 900 {
		t.Fatalf("median = %v, %v; want 900", v, ok)
	}
	if _, ok := f.median("BenchmarkDecode/payload=64B", "MB/s"); ok {
		t.Fatal("a benchmark that did not run has a median")
	}
	g := loadGoals(t)[0]
	text, met := g.measure(f)
	if text != "0.90×" || met != "" {
		t.Fatalf("decode vs CRC: %q %q", text, met)
	}
}

// TestSameNameTwoPackages: one benchmark name from two packages mixes
// their figures; the report says so.
func TestSameNameTwoPackages(t *testing.T) {
	out := `pkg: example/a
BenchmarkDecode-2   10  100 ns/op
pkg: example/b
BenchmarkDecode-2   10  200 ns/op
BenchmarkOther-2    10  200 ns/op
BenchmarkNoProcs/a-b    10  200 ns/op
`
	f, _, warnings, err := parse(strings.NewReader(out))
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "example/a and example/b") {
		t.Fatalf("warnings %q, err %v", warnings, err)
	}
	if _, ok := f.median("BenchmarkNoProcs/a-b", "ns/op"); !ok {
		t.Errorf("a name without the -GOMAXPROCS suffix lost its end: %v", f)
	}
}

// TestNotMeasured: a goal whose benchmark did not run stays in the report,
// says so and names what is missing; a missing optional figure only drops
// out of the text.
func TestNotMeasured(t *testing.T) {
	f, _, _, err := parse(strings.NewReader(`BenchmarkFollow/payload=64/paired-2  1  100 ns/op  97 %decoder-speed
`))
	if err != nil {
		t.Fatal(err)
	}
	var follow, seek goal
	for _, g := range loadGoals(t) {
		if strings.Contains(g.What, "64 B payloads from the beginning") {
			follow = g
		}
		if strings.HasPrefix(g.What, "seek by sequence") {
			seek = g
		}
	}
	if text, met := follow.measure(f); text != "97%" || met != "yes" {
		t.Errorf("follow: %q %q, want 97%% without the optional file size", text, met)
	}
	text, met := seek.measure(f)
	if !strings.HasPrefix(text, notMeasured) || !strings.Contains(text, "`BenchmarkSeek/by=seq` max-blocks/seek") || met != "—" {
		t.Errorf("seek: %q %q", text, met)
	}
}

// TestEveryGoalInReport: the report of an empty run still lists every goal,
// each marked not measured.
func TestEveryGoalInReport(t *testing.T) {
	var buf bytes.Buffer
	if err := report(&buf, loadGoals(t), figures{}, "Test CPU", nil, time.Unix(0, 0), "0.00 0.00 0.00"); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	seen := map[string]bool{}
	for _, g := range loadGoals(t) {
		if seen[g.What] {
			t.Errorf("two goals say %q", g.What)
		}
		seen[g.What] = true
		line := "| " + g.Issue + " | " + g.What + " | " + notMeasured
		if !strings.Contains(out, line) {
			t.Errorf("report lacks %q", line)
		}
	}
	if n := strings.Count(out, notMeasured); n != len(loadGoals(t))+1 { // +1: the explanation above the table
		t.Errorf("%d mentions of %q for %d goals", n, notMeasured, len(loadGoals(t)))
	}
}

// TestGoalThresholds checks the comparisons of a few goals at their limits,
// MB against MiB included.
func TestGoalThresholds(t *testing.T) {
	find := func(prefix string) goal {
		for _, g := range loadGoals(t) {
			if strings.HasPrefix(g.What, prefix) {
				return g
			}
		}
		t.Fatalf("no goal %q", prefix)
		return goal{}
	}
	for _, tc := range []struct {
		goal string
		v    float64
		met  bool
	}{
		{"following a 2 GiB file", 47.6, true},  // 49.9 MB
		{"following a 2 GiB file", 47.8, false}, // 50.1 MB
		{"retrytimer heap in use with 100 000 pending 1 KiB copies, durable", 95.3, true},
		{"retrytimer heap in use with 100 000 pending 1 KiB copies, durable", 95.4, false},
		{"ten followed files", 0.99, true},
		{"ten followed files", 1, false},
		{"seek by time", 64, true},
		{"seek by time", 65, false},
		{"follower latency run: polls", 0, true},
		{"follower latency run: polls", 1, false},
		{"offsets commits per 100 ms interval with positions set as fast", 1, true},
		{"offsets commits per 100 ms interval with positions set as fast", 1.1, false},
		{"streamd run, replay 1 000 000 × 512 B JSON records each enveloped", 0.6, true},
		{"streamd run, replay 1 000 000 × 512 B JSON records each enveloped", 0.59, false},
		{"the daemon's work per record between reading it and handing it to discard", 0, true},
		{"the daemon's work per record between reading it and handing it to discard", 0.01, false},
		{"streamd run, replay of the 1 000 000 plain records", 0.65, true},
		{"streamd run, replay of the 1 000 000 plain records", 0.64, false},
	} {
		if got, ok := find(tc.goal).met(tc.v); !ok || got != tc.met {
			t.Errorf("%s at %v: met %v, want %v", tc.goal, tc.v, got, tc.met)
		}
	}
}

// TestEnvelopeGoals: the ratios of BenchmarkRunEnvelopes, as it reports
// them in one line, make the two goals of issue 19, with the rates beside
// them.
func TestEnvelopeGoals(t *testing.T) {
	f, _, _, err := parse(strings.NewReader(`BenchmarkRunEnvelopes-2  2  4733948030 ns/op  1690422 crc-records/s  1100000 enveloped-records/s  1500000 plain-records/s  0.8873 plain-x-crc  0.7333 x-plain
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"streamd run, replay 1 000 000 × 512 B JSON records each enveloped": "0.73× (enveloped 1100000 records/s, plain 1500000 records/s)",
		"streamd run, replay of the 1 000 000 plain records":                "0.89× (CRC pass 1690422 records/s)",
	}
	for _, g := range loadGoals(t) {
		for prefix, text := range want {
			if !strings.HasPrefix(g.What, prefix) {
				continue
			}
			if got, met := g.measure(f); got != text || met != "yes" {
				t.Errorf("%s: %q %q, want %q yes", prefix, got, met, text)
			}
			delete(want, prefix)
		}
	}
	if len(want) > 0 {
		t.Errorf("no goals %q", want)
	}
}

func loadGoals(t *testing.T) []goal {
	t.Helper()
	g, err := goals()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGoalsFileChecked: goals refuses a goals.toml it would misreport.
func TestGoalsFileChecked(t *testing.T) {
	good := `[[goal]]
issue = "#1"
what = "w"
figures = [{bench = "B", unit = "u", format = "%.0f"}]
`
	for _, tc := range []struct{ name, file, err string }{
		{"unknown key", good + "at_mots = 1\ntarget = \"t\"\n", "unknown keys"},
		{"two thresholds", good + "at_most = 1\nat_least = 0\ntarget = \"t\"\n", "more than one threshold"},
		{"threshold without target", good + "at_most = 1\n", "needs its target"},
		{"ratio of one figure", good + "ratio = true\n", "two figures"},
		{"optional value", strings.Replace(good, `format = "%.0f"`, `optional = true`, 1), "not optional"},
		{"figure without unit", strings.Replace(good, `unit = "u", `, "", 1), "bench and unit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(f string) { goalsFile = f }(goalsFile)
			goalsFile = good
			if _, err := goals(); err != nil {
				t.Fatalf("the good file: %v", err)
			}
			goalsFile = tc.file
			if _, err := goals(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err %v, want %q", err, tc.err)
			}
		})
	}
}
