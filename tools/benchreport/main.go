// Command benchreport turns the output of `go test -bench` (several runs of
// each benchmark, -count) into BENCHMARKS.md: the median of every figure,
// side by side, with each performance goal of the project and whether it is
// met. `make bench` runs it; the file is never written by hand.
package main

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
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

// goalsFile lists every measurable goal of the acceptance lists of issues
// 2 to 8, 19 and 20, and the figures they ask to see, grouped by the issue
// that sets them. It is data, read by goals: a goal whose benchmark did not
// run stays in the report, marked notMeasured.
//
//go:embed goals.toml
var goalsFile string

// goal is one line of the report: one goal of an issue, or a figure an
// issue asks to see (no threshold).
type goal struct {
	Issue   string   // where the goal is written: "#3 item 7"
	What    string   // what is measured, with the sizes that matter
	Figures []figure // the first is the goal's value
	// Ratio makes the value the first figure over the second, printed
	// with the first's format.
	Ratio bool
	// At most one threshold; none for a figure to report (Target may
	// still say what the issue asks of it).
	AtMost  *float64 `toml:"at_most"`
	AtLeast *float64 `toml:"at_least"`
	Below   *float64 // strictly below
	BelowMB *float64 `toml:"below_mb"` // the figure in MiB, the goal in MB
	Target  string   // the goal, in the issue's words
}

// figure names one figure of one benchmark and how a goal's line prints
// it: Format is a fmt format for the figure times Scale (1 when zero);
// an empty one prints nothing. An optional figure only adds to the text
// of the line: when it is missing, the goal is still measured.
type figure struct {
	Bench, Unit, Format string
	Scale               float64
	Optional            bool
}

// mib is the number of bytes in a MiB: the benchmarks report MiB, the
// issues write MB.
const mib = 1 << 20

// goals reads goalsFile.
func goals() ([]goal, error) {
	var file struct{ Goal []goal }
	md, err := toml.Decode(goalsFile, &file)
	if err != nil {
		return nil, fmt.Errorf("goals.toml: %w", err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("goals.toml: unknown keys %v", un)
	}
	for i, g := range file.Goal {
		if err := g.check(); err != nil {
			return nil, fmt.Errorf("goals.toml: goal %d (%q): %w", i+1, g.What, err)
		}
	}
	return file.Goal, nil
}

// check says what is wrong with a goal of goals.toml.
func (g goal) check() error {
	thresholds := 0
	for _, t := range []*float64{g.AtMost, g.AtLeast, g.Below, g.BelowMB} {
		if t != nil {
			thresholds++
		}
	}
	switch {
	case g.Issue == "" || g.What == "":
		return errors.New("issue and what are required")
	case len(g.Figures) == 0 || g.Figures[0].Optional:
		return errors.New("the first figure is the value: it must be there and not optional")
	case g.Ratio && len(g.Figures) < 2:
		return errors.New("a ratio needs two figures")
	case thresholds > 1:
		return errors.New("more than one threshold")
	case thresholds == 1 && g.Target == "":
		return errors.New("a threshold needs its target")
	}
	for _, f := range g.Figures {
		if f.Bench == "" || f.Unit == "" {
			return errors.New("every figure needs bench and unit")
		}
	}
	return nil
}

// met says whether v meets the goal's threshold; ok is false for a figure
// without one.
func (g goal) met(v float64) (met, ok bool) {
	switch {
	case g.AtMost != nil:
		return v <= *g.AtMost, true
	case g.AtLeast != nil:
		return v >= *g.AtLeast, true
	case g.Below != nil:
		return v < *g.Below, true
	case g.BelowMB != nil:
		return v*mib < *g.BelowMB*1e6, true
	}
	return false, false
}

const notMeasured = "not measured in this run"

// measure returns the text of the goal's figure, and whether it is met:
// "yes", "**no**", "" for a figure without a goal, or "—" when a required
// figure is missing.
func (g goal) measure(f figures) (text, met string) {
	v := make([]float64, len(g.Figures))
	var missing []figure
	for i, m := range g.Figures {
		x, ok := f.median(m.Bench, m.Unit)
		switch {
		case ok:
			v[i] = x
		case m.Optional:
			v[i] = math.NaN()
		default:
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return notMeasured + " (missing: " + list(missing, func(m figure) string { return m.Unit }) + ")", "—"
	}
	x, text := g.value(v)
	switch yes, ok := g.met(x); {
	case !ok:
		return text, ""
	case yes:
		return text, "yes"
	}
	return text, "**no**"
}

// value returns the goal's value from the medians of its figures, in
// order (NaN for a missing optional one), and its text: each figure in its
// format, the value in the first's.
func (g goal) value(v []float64) (float64, string) {
	x := v[0]
	if g.Ratio {
		x = v[0] / v[1]
	}
	var text strings.Builder
	for i, m := range g.Figures {
		y := v[i]
		if i == 0 {
			y = x
		}
		if m.Format == "" || math.IsNaN(y) {
			continue
		}
		if m.Scale != 0 {
			y *= m.Scale
		}
		fmt.Fprintf(&text, m.Format, y)
	}
	return x, text.String()
}

// source lists the benchmarks and metrics of a goal, for the report.
func (g goal) source() string {
	return list(g.Figures, func(m figure) string {
		if m.Optional {
			return m.Unit + " (optional)"
		}
		return m.Unit
	})
}

// list writes figures as "`BenchmarkA` u1, u2; `BenchmarkB` u3", naming
// each unit with unit.
func list(ms []figure, unit func(figure) string) string {
	var b strings.Builder
	for i, m := range ms {
		switch {
		case i == 0:
		case ms[i-1].Bench == m.Bench:
			b.WriteString(", ")
			b.WriteString(unit(m))
			continue
		default:
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "`%s` %s", m.Bench, unit(m))
	}
	return b.String()
}

func main() {
	goals, err := goals()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	f, cpu, warnings, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "benchreport: warning:", w)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	if err := report(os.Stdout, goals, f, cpu, warnings, time.Now(), strings.Join(strings.Fields(string(load) + " ? ? ?")[:3], " ")); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// report writes BENCHMARKS.md.
func report(out io.Writer, goals []goal, f figures, cpu string, warnings []string, now time.Time, load string) error {
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
	for _, g := range goals {
		text, m := g.measure(f)
		rows = append(rows, row{g, text, m})
		if m != "—" {
			measured++
		}
		switch m {
		case "yes":
			met++
		case "**no**":
			notMet = append(notMet, g.What)
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
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.g.Issue, r.g.What, r.text, r.g.Target, r.met, r.g.source())
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
