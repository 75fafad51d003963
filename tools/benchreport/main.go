// Command benchreport turns the output of `go test -bench` (several runs of
// each benchmark, -count) into BENCHMARKS.md: the median of every figure,
// side by side, with each performance goal of the project and whether it is
// met. `make bench` runs it; the file is never written by hand.
package main

import (
	"bufio"
	"fmt"
	"io"
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

func parse(r io.Reader) (figures, string, error) {
	f := figures{}
	cpu := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if c, ok := strings.CutPrefix(line, "cpu: "); ok {
			cpu = c
		}
		fields := strings.Fields(line)
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		name := fields[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			name = name[:i]
		}
		if f[name] == nil {
			f[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			f[name][fields[i+1]] = append(f[name][fields[i+1]], v)
		}
	}
	return f, cpu, sc.Err()
}

// goal is one line of the report.
type goal struct {
	what     string
	measured func(f figures) (value float64, text string, ok bool)
	met      func(v float64) bool // nil: a figure to report, no goal
	target   string
}

func ratio(f figures, a, ua, b, ub string) (float64, bool) {
	x, ok1 := f.median(a, ua)
	y, ok2 := f.median(b, ub)
	return x / y, ok1 && ok2 && y != 0
}

func one(name, unit, format string) func(figures) (float64, string, bool) {
	return func(f figures) (float64, string, bool) {
		v, ok := f.median(name, unit)
		return v, fmt.Sprintf(format, v), ok
	}
}

func goals() []goal {
	const sf = "BenchmarkDecode/payload="
	var g []goal
	g = append(g, goal{
		what: "decode 64 KiB payloads vs a bare CRC pass over the same bytes",
		measured: func(f figures) (float64, string, bool) {
			r, ok := ratio(f, sf+"64KiB", "MB/s", "BenchmarkCRC/payload=64KiB", "MB/s")
			return r, fmt.Sprintf("%.2f×", r), ok
		},
		met: func(v float64) bool { return v >= 0.8 }, target: "≥ 0.8×",
	}, goal{
		what:     "decode 64 B payloads, one core",
		measured: one(sf+"64B", "records/s", "%.0f records/s"),
		met:      func(v float64) bool { return v >= 5e6 }, target: "≥ 5 000 000 records/s",
	})
	for _, size := range []string{"64B", "1KiB", "64KiB"} {
		g = append(g, goal{
			what:     "decode " + size + " payloads: allocations per record",
			measured: one(sf+size, "allocs/record", "%.5f"),
			met:      func(v float64) bool { return v < 0.05 }, target: "0 in steady state (the buffer grows a few times per file)",
		}, goal{
			what: "decode " + size + " payloads vs a plain read of the file",
			measured: func(f figures) (float64, string, bool) {
				d, _ := f.median(sf+size, "MB/s")
				r, ok := f.median("BenchmarkRead/payload="+size, "MB/s")
				return d, fmt.Sprintf("%.0f MB/s decode, %.0f MB/s read", d, r), ok
			},
		}, goal{
			what: "append " + size + " payloads vs decode",
			measured: func(f figures) (float64, string, bool) {
				r, ok := ratio(f, sf+size, "MB/s", "BenchmarkAppend/payload="+size, "MB/s")
				return r, fmt.Sprintf("decode is %.2f× append", r), ok
			},
			met: func(v float64) bool { return v <= 2 }, target: "append within 2× of decode",
		})
	}
	g = append(g,
		goal{what: "follower latency p50 (appends 1 ms apart, poll 1 s)", measured: one("BenchmarkLatency", "p50-ms", "%.3f ms"),
			met: func(v float64) bool { return v <= 2 }, target: "≤ 2 ms"},
		goal{what: "follower latency p99", measured: one("BenchmarkLatency", "p99-ms", "%.3f ms"),
			met: func(v float64) bool { return v <= 10 }, target: "≤ 10 ms"},
		goal{what: "follower vs decoder, 64 B payloads", measured: one("BenchmarkFollow/payload=64/paired", "%decoder-speed", "%.0f%%"),
			met: func(v float64) bool { return v >= 90 }, target: "≥ 90%"},
		goal{what: "offsets commit (write, fsync, rename, fsync dir)", measured: one("BenchmarkCommit", "ns/op", "%.0f ns")},
		goal{what: "retrytimer Schedule+fire with 100 000 pending, memory-only", measured: one("BenchmarkScheduleFire/memory", "ns/op", "%.0f ns")},
		goal{what: "retrytimer Schedule+fire with 100 000 pending, durable spool", measured: one("BenchmarkScheduleFire/spool", "ns/op", "%.0f ns")},
		goal{what: "retrytimer heap with 100 000 pending 1 KiB copies, spool", measured: one("BenchmarkPending100k/spool", "MiB-heap-inuse", "%.1f MiB"),
			met: func(v float64) bool { return v < 100 }, target: "< 100 MB"},
		goal{what: "streamd run, replay 200 000 × 1 KiB into discard, positions committed", measured: one("BenchmarkRunDiscard", "records/s", "%.0f records/s"),
			met: func(v float64) bool { return v >= 500000 }, target: "≥ 500 000 records/s"},
		goal{what: "streamd run, http handler, concurrency 32, local server", measured: one("BenchmarkRunHTTP", "records/s", "%.0f records/s"),
			met: func(v float64) bool { return v >= 20000 }, target: "≥ 20 000 records/s"},
		goal{what: "streamd run, peak RSS with 100 000 retries pending", measured: one("BenchmarkRunPendingRetries", "peak-RSS-MiB", "%.1f MiB")},
		goal{what: "streamd pipe, discard, 100-byte lines", measured: one("BenchmarkPipeDiscard", "lines/s", "%.0f lines/s"),
			met: func(v float64) bool { return v >= 300000 }, target: "≥ 300 000 lines/s"},
	)
	return g
}

func main() {
	f, cpu, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(w, "# Benchmarks\n\nWritten by `make bench` (tools/benchreport) on %s: medians of the runs of each benchmark.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Machine: %s, %d cores, %s/%s, %s; load average when the report was written: %s.\n\n",
		cpu, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Fprintln(w, "| what | measured | goal | met |")
	fmt.Fprintln(w, "| --- | --- | --- | --- |")
	for _, g := range goals() {
		v, text, ok := g.measured(f)
		met := ""
		switch {
		case !ok:
			text, met = "not run", "—"
		case g.met == nil:
		case g.met(v):
			met = "yes"
		default:
			met = "**no**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", g.what, text, g.target, met)
	}
	fmt.Fprintln(w, "\n## Every figure (medians)")
	fmt.Fprintln(w, "\n| benchmark | figures |\n| --- | --- |")
	names := make([]string, 0, len(f))
	for name := range f {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		units := make([]string, 0, len(f[name]))
		for u := range f[name] {
			units = append(units, u)
		}
		slices.Sort(units)
		var parts []string
		for _, u := range units {
			v, _ := f.median(name, u)
			parts = append(parts, strconv.FormatFloat(v, 'g', 4, 64)+" "+u)
		}
		fmt.Fprintf(w, "| %s | %s |\n", name, strings.Join(parts, ", "))
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}
