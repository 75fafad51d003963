// Command benchreport turns the output of `go test -bench` (several runs of
// each benchmark, -count) into BENCHMARKS.md: the median of every figure,
// side by side, with each performance goal of the project and whether it is
// met. `make bench` runs it; the file is never written by hand.
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// figures holds every value reported, by benchmark name (without the
// -GOMAXPROCS suffix) and unit.
type figures map[string]map[string][]float64

// median returns the median of a benchmark's values in unit, and whether
// the benchmark reported it.
func (f figures) median(name, unit string) (float64, bool) {
	v := slices.Clone(f[name][unit])
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	return v[len(v)/2], true
}

// parse reads the output of `go test -bench`. It also returns the CPU
// line, and a warning for each benchmark name that more than one package
// reported (their figures are mixed under one name).
func parse(r io.Reader) (f figures, cpu string, warnings []string, err error) {
	f = figures{}
	pkgOf := map[string]string{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if c, ok := strings.CutPrefix(line, "cpu: "); ok {
			cpu = c
		}
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
		}
		fields := strings.Fields(line)
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		name := fields[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil { // the -GOMAXPROCS suffix
				name = name[:i]
			}
		}
		if f[name] == nil {
			f[name] = map[string][]float64{}
			pkgOf[name] = pkg
		} else if pkgOf[name] != pkg && pkgOf[name] != "?" {
			warnings = append(warnings, fmt.Sprintf("%s is reported by both %s and %s: its figures mix the two", name, pkgOf[name], pkg))
			pkgOf[name] = "?"
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			f[name][fields[i+1]] = append(f[name][fields[i+1]], v)
		}
	}
	return f, cpu, warnings, sc.Err()
}

// metric names one figure of one benchmark. An optional one only adds to
// the text of a goal's line: when it is missing, the goal is still
// measured, and its value is NaN.
type metric struct {
	bench, unit string
	optional    bool
}

// goal is one line of the report: one goal of an issue, or a figure an
// issue asks to see (met is nil).
type goal struct {
	issue  string // where the goal is written: "#3 item 7"
	what   string // what is measured, with the sizes that matter
	from   []metric
	value  func(v []float64) (float64, string) // v: the medians of from, in order
	met    func(v float64) bool                // nil: a figure to report, no goal
	target string                              // the goal, in the issue's words
}

const notMeasured = "not measured in this run"

// measure returns the text of the goal's figure, and whether it is met:
// "yes", "**no**", "" for a figure without a goal, or "—" when a required
// figure is missing.
func (g goal) measure(f figures) (text, met string) {
	v := make([]float64, len(g.from))
	var missing []metric
	for i, m := range g.from {
		x, ok := f.median(m.bench, m.unit)
		switch {
		case ok:
			v[i] = x
		case m.optional:
			v[i] = math.NaN()
		default:
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return notMeasured + " (missing: " + list(missing, func(m metric) string { return m.unit }) + ")", "—"
	}
	x, text := g.value(v)
	switch {
	case g.met == nil:
		return text, ""
	case g.met(x):
		return text, "yes"
	}
	return text, "**no**"
}

// source lists the benchmarks and metrics of a goal, for the report.
func (g goal) source() string {
	return list(g.from, func(m metric) string {
		if m.optional {
			return m.unit + " (optional)"
		}
		return m.unit
	})
}

// list writes metrics as "`BenchmarkA` u1, u2; `BenchmarkB` u3", naming
// each unit with unit.
func list(ms []metric, unit func(metric) string) string {
	var b strings.Builder
	for i, m := range ms {
		switch {
		case i == 0:
		case ms[i-1].bench == m.bench:
			b.WriteString(", ")
			b.WriteString(unit(m))
			continue
		default:
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "`%s` %s", m.bench, unit(m))
	}
	return b.String()
}

// perVariant makes one goal per variant of the benchmark named prefix plus
// the variant's sub-benchmark name; each pair of variants is that name and
// how the goal names the variant.
func perVariant(prefix string, variants [][2]string, goalsOf func(bench, name string) []goal) []goal {
	var out []goal
	for _, v := range variants {
		out = append(out, goalsOf(prefix+v[0], v[1])...)
	}
	return out
}

// one is a goal's value that is its first figure, printed with format; the
// optional figures that follow it in the goal's from are each printed after
// it with their format in optional, or leave nothing when they are missing.
func one(format string, optional ...string) func([]float64) (float64, string) {
	return func(v []float64) (float64, string) {
		text := fmt.Sprintf(format, v[0])
		for i, o := range optional {
			if !math.IsNaN(v[i+1]) {
				text += fmt.Sprintf(o, v[i+1])
			}
		}
		return v[0], text
	}
}

// ratio is a goal's value that is the first figure over the second.
func ratio(format string) func([]float64) (float64, string) {
	return func(v []float64) (float64, string) {
		r := v[0] / v[1]
		return r, fmt.Sprintf(format, r)
	}
}

func atMost(limit float64) func(float64) bool  { return func(v float64) bool { return v <= limit } }
func atLeast(limit float64) func(float64) bool { return func(v float64) bool { return v >= limit } }
func below(limit float64) func(float64) bool   { return func(v float64) bool { return v < limit } }

// mib is the number of bytes in a MiB: the benchmarks report MiB, the
// issues write MB.
const mib = 1 << 20

func belowMB(mb float64) func(float64) bool {
	return func(v float64) bool { return v*mib < mb*1e6 }
}

func m(bench, unit string) metric   { return metric{bench: bench, unit: unit} }
func opm(bench, unit string) metric { return metric{bench: bench, unit: unit, optional: true} }

// goals are every measurable goal of the acceptance lists of issues 2 to 8,
// 19 and 20, and the figures they ask to see, grouped by the issue that
// sets them, the groups mostly in the order of the issues: issue 19's http
// batches sit among issue 5's runs of the real binary, and its records
// with headers after issue 20's. A goal whose benchmark did not run stays
// in the report, marked notMeasured.
func goals() []goal {
	const (
		dec = "BenchmarkDecode/payload="
		crc = "BenchmarkCRC/payload="
		rd  = "BenchmarkRead/payload="
		app = "BenchmarkAppend/payload="
	)
	return slices.Concat(
		// Issue 2, item 9: the codec; 64 MiB files (streamfile/bench_test.go).
		[]goal{{
			issue: "#2 item 9", what: "decode 64 KiB payloads through reads into the decoder's buffer, as a follower and `streamd decode` read a file, one core, vs a bare CRC pass over the same bytes in memory (64 MiB file, cached as read from disk): the copy out of the page cache (the plain read below) comes on top of the checksums",
			from:  []metric{m(dec+"64KiB", "MB/s"), m(crc+"64KiB", "MB/s")},
			value: ratio("%.2f×"),
		}, {
			issue: "#2 item 9", what: "decode 64 B payloads, one core (64 MiB file)",
			from:  []metric{m(dec+"64B", "records/s")},
			value: one("%.0f records/s"), met: atLeast(5e6), target: "≥ 5 000 000 records/s on one core",
		}},
		perVariant("", [][2]string{{"64B", "64 B"}, {"1KiB", "1 KiB"}, {"64KiB", "64 KiB"}}, func(size, name string) []goal {
			return []goal{{
				issue: "#2 item 9", what: "decode " + name + " payloads, beside a bare CRC pass and a plain read of the same 64 MiB file",
				from: []metric{m(dec+size, "MB/s"), m(dec+size, "records/s"), m(crc+size, "MB/s"), m(rd+size, "MB/s")},
				value: func(v []float64) (float64, string) {
					return v[0], fmt.Sprintf("decode %.0f MB/s (%.0f records/s); CRC %.0f MB/s; read %.0f MB/s", v[0], v[1], v[2], v[3])
				},
				target: "printed side by side",
			}, {
				issue: "#2 item 9", what: "decode " + name + " payloads: allocations per record",
				from:  []metric{m(dec+size, "allocs/record")},
				value: one("%.5f"), met: below(0.05), target: "0 allocations per record in steady state (the buffer grows a few times per file)",
			}, {
				issue: "#2 item 9", what: "append " + name + " payloads (1024-frame batches) vs decode",
				from: []metric{m(dec+size, "MB/s"), m(app+size, "MB/s")},
				value: func(v []float64) (float64, string) {
					r := v[0] / v[1]
					return r, fmt.Sprintf("decode is %.2f× append (append %.0f MB/s)", r, v[1])
				},
				met: atMost(2), target: "writer append throughput within 2× of decode",
			}}
		}),
		// Issue 3: the follower (tail/bench_test.go).
		[]goal{
			{issue: "#3 item 1, #8", what: "follower latency p50, from a completed append to the record leaving the follower (appends 1 ms apart, poll 1 s)",
				from:  []metric{m("BenchmarkLatency", "p50-ms")},
				value: one("%.3f ms"), met: atMost(2), target: "p50 ≤ 2 ms"},
			{issue: "#3 item 1, #8", what: "follower latency p99 (same run)",
				from:  []metric{m("BenchmarkLatency", "p99-ms")},
				value: one("%.3f ms"), met: atMost(10), target: "p99 ≤ 10 ms"},
			{issue: "#3 item 1", what: "follower latency run: polls that found data the notifications had not delivered (poll 1 s)",
				from:  []metric{m("BenchmarkLatency", "poll-reads")},
				value: one("%.0f"), met: atMost(0), target: "0: through notifications, not the poll"},
		},
		perVariant("BenchmarkFollow/payload=", [][2]string{{"64/paired", "64 B"}, {"1024/paired", "1 KiB"}}, func(b, name string) []goal {
			return []goal{{issue: "#3 item 2", what: "follow a file of " + name + " payloads from the beginning into a no-op consumer, vs the bare decoder (runs alternated)",
				from: []metric{m(b, "%decoder-speed"), opm(b, "file-MiB")}, value: one("%.0f%%", " (%.0f MiB file)"),
				met: atLeast(90), target: "≥ 90% of the decoder's speed (the issue: on a 1 GB file; the benchmark uses 64 MiB unless STREAMD_LARGE_TESTS=1)"}}
		}),
		[]goal{
			{issue: "#3 item 5", what: "ten followed files with no writes: CPU time of the whole process (getrusage) over 10 s windows",
				from:  []metric{m("BenchmarkIdleCPU", "%one-core")},
				value: one("%.3f%% of one core"), met: below(1), target: "< 1% of one core over 10 s"},
			{issue: "#3 item 6, #8", what: "following a 2 GiB file of 1 KiB payloads from the beginning: peak RSS of the follower's process (VmHWM)",
				from:  []metric{m("BenchmarkFollowRSS", "peak-RSS-MiB"), opm("BenchmarkFollowRSS", "heap-sys-MiB")},
				value: one("%.1f MiB", " (Go heap %.1f MiB)"),
				met:   belowMB(50), target: "RSS under 50 MB"},
		},
		perVariant("BenchmarkSeek/by=", [][2]string{{"seq", "sequence"}, {"time", "time"}}, func(b, name string) []goal {
			return []goal{{
				issue: "#3 item 7",
				what:  "seek by " + name + " in a 1 GiB file (1 KiB payloads, a beacon every 64 KiB): beacon-sized blocks read until the first record, worst seek",
				from:  []metric{m(b, "max-blocks/seek"), opm(b, "max-reads/seek"), opm(b, "max-KiB/read")},
				value: one("%.0f blocks", " in %.0f reads", ", largest read %.1f KiB"),
				met:   atMost(64), target: "at most 64 beacon-sized blocks",
			}}
		}),
		// Issue 4: offsets and retrytimer (offsets/*_test.go, retrytimer/bench_test.go).
		[]goal{
			{issue: "#4 item 6", what: "retrytimer Schedule+fire with 100 000 pending, memory-only",
				from: []metric{m("BenchmarkScheduleFire/memory", "ns/op")}, value: one("%.0f ns")},
			{issue: "#4 item 6", what: "retrytimer Schedule+fire with 100 000 pending, durable spool (fsync)",
				from: []metric{m("BenchmarkScheduleFire/spool", "ns/op")}, value: one("%.0f ns")},
			{issue: "#4 build", what: "retrytimer Schedule+fire, memory-only: cost with 100 000 pending over the cost with 1 000",
				from:  []metric{m("BenchmarkScheduleFireScaling/pending=100000", "ns/op"), m("BenchmarkScheduleFireScaling/pending=1000", "ns/op")},
				value: ratio("%.2f×"), met: atMost(3), target: "O(log n) per operation: ≤ 3× (log n gives 1.7×, a scan 100×)"},
			{issue: "#4 item 6 and build, #8", what: "retrytimer heap in use with 100 000 pending 1 KiB copies, durable spool",
				from: []metric{m("BenchmarkPending100k/spool", "MiB-heap-inuse")}, value: one("%.1f MiB"), met: belowMB(100), target: "under 100 MB"},
			{issue: "#4 item 6", what: "retrytimer heap in use with 100 000 pending 1 KiB copies, memory-only (the pipe stage's queue, payloads in memory; the stage bounds it with max_delayed_mib, default 256)",
				from: []metric{m("BenchmarkPending100k/memory", "MiB-heap-inuse")}, value: one("%.1f MiB")},
			{issue: "#4 item 6, #8", what: "offsets commit of 16 subscriptions (write, fsync, rename, fsync dir)",
				from: []metric{m("BenchmarkCommit", "ns/op")}, value: func(v []float64) (float64, string) { return v[0], fmt.Sprintf("%.2f ms", v[0]/1e6) }},
			{issue: "#4 build", what: "offsets commits per 100 ms interval with no position changed",
				from: []metric{m("BenchmarkCommitRate/rate=idle", "commits/interval")}, value: one("%.2f"),
				met: atMost(0), target: "a commit with nothing new writes nothing"},
		},
		perVariant("BenchmarkCommitRate/rate=", [][2]string{{"1000", "positions set 1 000 times/s"}, {"max", "positions set as fast as Set goes"}}, func(b, what string) []goal {
			return []goal{{issue: "#4 item 6", what: "offsets commits per 100 ms interval with " + what + " (a commit: one fsync of the sidecar, one of the directory)",
				from: []metric{m(b, "commits/interval"), opm(b, "ms/commit"), opm(b, "records/s")}, value: one("%.2f", " (%.1f ms each", "; %.0f positions/s)"),
				met: atMost(1), target: "one fsync per interval, independent of the record rate"}}
		}),
		[]goal{
			// Issue 5: the real binary (cmd/streamd/run_bench_test.go).
			{issue: "#5 item 10, #8", what: "streamd run, replay 200 000 × 1 KiB from a prepared file into discard, positions committed",
				from: []metric{m("BenchmarkRunDiscard", "records/s")}, value: one("%.0f records/s"),
				met: atLeast(500000), target: "≥ 500 000 records/s end to end"},
			{issue: "#8", what: "streamd run, peak RSS while replaying 200 000 × 1 KiB into discard",
				from: []metric{m("BenchmarkRunDiscard", "peak-RSS-MiB")}, value: one("%.1f MiB")},
			{issue: "#5 item 10, #8", what: "streamd run, replay 50 000 × 100 B into the http handler, concurrency 32, local server",
				from: []metric{m("BenchmarkRunHTTP", "records/s")}, value: one("%.0f records/s"),
				met: atLeast(20000), target: "≥ 20 000 records/s"},
			{issue: "#5 item 10", what: "the floor under the line above: net/http alone, in a process of its own, posting 100 B bodies from 32 goroutines to the same kind of local server, no daemon",
				from: []metric{m("BenchmarkHTTPClientFloor", "requests/s")}, value: one("%.0f requests/s")},
			// Issue 19: http batches (cmd/streamd/run_bench_test.go).
			{issue: "#19 item 3", what: "streamd run, replay 500 000 × 100 B into the http handler in batches of 500 (concurrency 4), local net/http server answering 204, positions committed",
				from: []metric{m("BenchmarkRunHTTPBatch", "records/s")}, value: one("%.0f records/s"),
				met: atLeast(300000), target: "≥ 300 000 records/s end to end"},
			{issue: "#19 item 3", what: "the same run: batches vs one request per record (50 000 × 100 B, concurrency 32, as `BenchmarkRunHTTP`)",
				from:  []metric{m("BenchmarkRunHTTPBatch", "x-single"), m("BenchmarkRunHTTPBatch", "single-records/s")},
				value: one("%.1f×", " (one request per record: %.0f records/s)")},
			{issue: "#5 item 10, #8", what: "streamd run, peak RSS with 100 000 retries of 1 KiB pending",
				from:  []metric{m("BenchmarkRunPendingRetries", "peak-RSS-MiB")},
				value: one("%.1f MiB")},
			// Issue 6: the pipe stage (cmd/streamd/pipe_bench_test.go).
			{issue: "#6 item 5", what: "streamd pipe, discard, 1 000 000 lines of 100 bytes, wall clock (start-up included)",
				from: []metric{m("BenchmarkPipeDiscard", "lines/s")}, value: one("%.0f lines/s"),
				met: atLeast(300000), target: "≥ 300 000 lines/s through the stage"},
			{issue: "#6 item 5", what: "streamd pipe, same run, lines per second of the stage's own CPU time (less disturbed by other load)",
				from:  []metric{m("BenchmarkPipeDiscard", "lines/cpu-s")},
				value: one("%.0f lines/CPU-s")},
			// Issue 20: forwarding into NATS JetStream (cmd/streamd/nats_bench_test.go).
			{issue: "#20 item 5", what: "streamd run, replay 1 000 000 × 512 B into a file-storage JetStream stream (nats handler, concurrency 512, the server in the benchmark's process), vs nats bench js pub async on the same server, same size, no headers, no message id",
				from:  []metric{m("BenchmarkRunNATS", "x-nats-bench"), m("BenchmarkRunNATS", "records/s"), m("BenchmarkRunNATS", "nats-bench-msgs/s")},
				value: one("%.2f×", " (streamd %.0f records/s", ", nats bench %.0f msgs/s)"),
				met:   atLeast(0.8), target: "≥ 0.8× nats bench's rate"},
			{issue: "#20 item 5", what: "the same, with nats bench publishing messages like streamd's: a Nats-Msg-Id on each (checked against the duplicate window) and the same metadata headers",
				from:  []metric{m("BenchmarkRunNATS", "x-nats-bench-same"), m("BenchmarkRunNATS", "nats-bench-same-msgs/s")},
				value: one("%.2f×", " (nats bench %.0f msgs/s)")},
			// Issue 19: records with headers (cmd/streamd/envelope_bench_test.go, daemon/open_test.go).
			{issue: "#19 item 1", what: "streamd run, replay 1 000 000 × 512 B JSON records each enveloped with two headers (rs1:, a trace id and a content type) into discard, positions committed, vs the same payloads plain, in the same run",
				from:  []metric{m("BenchmarkRunEnvelopes", "x-plain"), opm("BenchmarkRunEnvelopes", "enveloped-records/s"), opm("BenchmarkRunEnvelopes", "plain-records/s")},
				value: one("%.2f×", " (enveloped %.0f records/s", ", plain %.0f records/s)"),
				met:   atLeast(0.6), target: "≥ 0.6× the plain rate"},
			{issue: "#19 item 1", what: "the daemon's work per record between reading it and handing it to discard, 512 B payload enveloped with two headers: allocations",
				from:  []metric{m("BenchmarkOpen/rs1_two_headers_512B/discard", "allocs/op"), opm("BenchmarkOpen/rs1_two_headers_512B/discard", "ns/op")},
				value: one("%.0f allocations per record", " (%.0f ns)"),
				met:   atMost(0), target: "0 allocations per record"},
			{issue: "#19 item 1", what: "the same for a handler that reads records (the envelope checked, headers and payload decoded): allocations",
				from:  []metric{m("BenchmarkOpen/rs1_two_headers_512B/reads", "allocs/op"), opm("BenchmarkOpen/rs1_two_headers_512B/reads", "ns/op")},
				value: one("%.0f allocations per record", " (%.0f ns)")},
			{issue: "#19 item 2", what: "streamd run, replay of the 1 000 000 plain records of the enveloped replay above into discard, vs a bare CRC-16 pass over their file's bytes in memory, in the same run",
				from:  []metric{m("BenchmarkRunEnvelopes", "plain-x-crc"), opm("BenchmarkRunEnvelopes", "crc-records/s")},
				value: one("%.2f×", " (CRC pass %.0f records/s)"),
				met:   atLeast(0.65), target: "≥ 0.65× the CRC pass"},
		})
}

func main() {
	f, cpu, warnings, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "benchreport: warning:", w)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	if err := report(os.Stdout, f, cpu, warnings, time.Now(), strings.Join(strings.Fields(string(load) + " ? ? ?")[:3], " ")); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// report writes BENCHMARKS.md.
func report(out io.Writer, f figures, cpu string, warnings []string, now time.Time, load string) error {
	w := bufio.NewWriter(out)
	fmt.Fprintf(w, "# Benchmarks\n\nWritten by `make bench` (tools/benchreport) on %s: medians of the runs of each benchmark.\n\n",
		now.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Machine: %s, %d cores, %s/%s, %s; load average when the report was written: %s.\n\n",
		cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), load)
	type row struct {
		g         goal
		text, met string
	}
	var rows []row
	measured, met := 0, 0
	var notMet []string
	for _, g := range goals() {
		text, m := g.measure(f)
		rows = append(rows, row{g, text, m})
		if m != "—" {
			measured++
		}
		switch m {
		case "yes":
			met++
		case "**no**":
			notMet = append(notMet, g.what)
		}
	}
	fmt.Fprintf(w, "Every measurable goal of the acceptance lists of issues 2–8, 19 and 20, and every figure they ask to see: %d lines, %d measured in this run; %d goals met, %d not met.",
		len(rows), measured, met, len(notMet))
	if measured < len(rows) {
		fmt.Fprintf(w, " A line whose benchmark did not run says %q and names what is missing.", notMeasured)
	}
	fmt.Fprintln(w)
	for _, warning := range warnings {
		fmt.Fprintf(w, "\n**Warning:** %s.\n", warning)
	}
	fmt.Fprintln(w, "\n| issue | what | measured | goal | met | benchmark and metric |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.g.issue, r.g.what, r.text, r.g.target, r.met, r.g.source())
	}
	fmt.Fprintln(w, "\n## Every figure (medians)")
	fmt.Fprintln(w, "\n| benchmark | runs | figures |\n| --- | --- | --- |")
	names := make([]string, 0, len(f))
	for name := range f {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		units := make([]string, 0, len(f[name]))
		runs := 0
		for u, v := range f[name] {
			units = append(units, u)
			runs = max(runs, len(v))
		}
		slices.Sort(units)
		var parts []string
		for _, u := range units {
			v, _ := f.median(name, u)
			parts = append(parts, strconv.FormatFloat(v, 'g', 4, 64)+" "+u)
		}
		fmt.Fprintf(w, "| %s | %d | %s |\n", name, runs, strings.Join(parts, ", "))
	}
	return w.Flush()
}
