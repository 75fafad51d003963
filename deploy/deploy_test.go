package deploy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/metrics"
)

const (
	rulesFile     = "prometheus/streamd.rules.yml"
	rulesTestFile = "prometheus/streamd.rules.test.yml"
	dashboardFile = "grafana/streamd.json"
	unitFile      = "systemd/streamd.service"
	exampleConfig = "../configs/streamd.toml"
)

// promtool returns the path of promtool, or skips the test when it is not
// installed (CI installs it: .ci/run).
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
	}
	return path
}

// TestRulesCheck runs promtool check rules on the alert rules.
func TestRulesCheck(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
}

// TestRulesUnitTests runs the unit tests of the alert rules with promtool
// test rules.
func TestRulesUnitTests(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", rulesTestFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", rulesTestFile, err, out)
	}
}

var (
	alertLine     = regexp.MustCompile(`^\s*- alert: (\w+)\s*$`)
	alertnameLine = regexp.MustCompile(`^\s*alertname: (\w+)\s*$`)
	expAlertsLine = regexp.MustCompile(`^\s*exp_alerts:\s*(\[\])?\s*$`)
)

// TestEveryAlertTested checks that every alert has an evaluation in the
// unit tests where it fires and one where it stays quiet, and that every
// alert has a summary, a description, a runbook link and a section of the
// README's runbook.
func TestEveryAlertTested(t *testing.T) {
	alerts := matchLines(t, rulesFile, alertLine)
	if len(alerts) == 0 {
		t.Fatalf("%s: no alerts found", rulesFile)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	var current string
	for _, line := range readLines(t, rulesTestFile) {
		if m := alertnameLine.FindStringSubmatch(line); m != nil {
			current = m[1]
		} else if m := expAlertsLine.FindStringSubmatch(line); m != nil {
			if m[1] == "" {
				fires[current] = true
			} else {
				quiet[current] = true
			}
		}
	}
	rules := readFile(t, rulesFile)
	readme := readFile(t, "../README.md")
	for _, name := range alerts {
		if !fires[name] {
			t.Errorf("%s: no test where alert %s fires", rulesTestFile, name)
		}
		if !quiet[name] {
			t.Errorf("%s: no test where alert %s stays quiet (exp_alerts: [])", rulesTestFile, name)
		}
		if !strings.Contains(rules, "https://github.com/streamd/streamd#"+strings.ToLower(name)) {
			t.Errorf("%s: alert %s has no runbook_url to the README's section", rulesFile, name)
		}
		if !strings.Contains(readme, "\n#### "+name+"\n") {
			t.Errorf("README.md: no runbook section \"#### %s\"", name)
		}
	}
	if n := strings.Count(rules, "summary:"); n != len(alerts) {
		t.Errorf("%s: %d summaries for %d alerts", rulesFile, n, len(alerts))
	}
	if n := strings.Count(rules, "description:"); n != len(alerts) {
		t.Errorf("%s: %d descriptions for %d alerts", rulesFile, n, len(alerts))
	}
}

// metricName matches the names of streamd's metrics and of the Go runtime
// and process collectors, wherever the rules and the dashboard name them
// (queries, descriptions).
var metricName = regexp.MustCompile(`\b(?:streamd|process|go)_[a-z0-9_]*[a-z0-9]\b`)

// TestMetricNamesExist checks that every metric the alert rules or the
// dashboard name is in the exposition of a daemon's registry with a stream
// and a subscription, histograms with their _bucket, _sum and _count
// series. up is the one name Prometheus itself adds.
func TestMetricNamesExist(t *testing.T) {
	reg := metrics.NewRegistry()
	m := metrics.New(reg)
	m.Stream("orders")
	m.Subscription("billing", "orders").FailedDeliveries("unreachable")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[string]bool{}
	for _, mf := range families {
		exposed[mf.GetName()] = true
		if mf.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exposed[mf.GetName()+suffix] = true
			}
		}
	}

	var dashboard map[string]any
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &dashboard); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs := dashboardExprs(dashboard)
	if len(exprs) == 0 {
		t.Fatalf("%s: no queries found", dashboardFile)
	}
	for _, src := range []struct{ file, text string }{
		{rulesFile, readFile(t, rulesFile)},
		{dashboardFile, readFile(t, dashboardFile)},
	} {
		names := metricName.FindAllString(src.text, -1)
		if len(names) == 0 {
			t.Fatalf("%s: no metric names found", src.file)
		}
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			if !exposed[name] {
				t.Errorf("%s names %s, which streamd does not expose (metrics/testdata/names.golden lists what it does)", src.file, name)
			}
		}
	}
	for _, expr := range exprs {
		if !metricName.MatchString(expr) {
			t.Errorf("%s: query %q names no streamd metric", dashboardFile, expr)
		}
	}
}

// TestDashboardQueriesParse checks the dashboard's queries with promtool,
// as the expressions of recording rules, its variables replaced by values.
func TestDashboardQueriesParse(t *testing.T) {
	tool := promtool(t)
	var dashboard map[string]any
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &dashboard); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, expr := range dashboardExprs(dashboard) {
		q, err := json.Marshal(vars.Replace(expr)) // a JSON string is a YAML string
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "      - record: dashboard:query%d\n        expr: %s\n", i, q)
	}
	file := filepath.Join(t.TempDir(), "dashboard.rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("%s: a query does not parse: %v\n%s", dashboardFile, err, out)
	}
}

// TestUnitStartStop checks what starting and stopping the unit rely on.
// The check before a start refuses only a configuration file that does not
// load: a stream file or a handler's server that is not there yet holds
// back its own subscriptions while the rest runs, so checking them would
// stop every start, a boot's and a package upgrade's too. A stop signals
// streamd alone (KillMode=mixed), which lets exec commands finish within
// shutdown_timeout, and systemd waits for that, the stop's grace (a
// handler that ignores its deadline, an exec command's output) and the
// final commit before it kills.
func TestUnitStartStop(t *testing.T) {
	unit := unitSettings(t, unitFile)
	pre := unit["ExecStartPre"]
	if len(pre) != 1 || !strings.Contains(pre[0], " check-config --no-files ") || strings.Contains(pre[0], "--handlers") {
		t.Errorf("%s: ExecStartPre=%q, want one streamd check-config --no-files, without --handlers", unitFile, pre)
	}
	if got := unit["KillMode"]; !slices.Equal(got, []string{"mixed"}) {
		t.Errorf("%s: KillMode=%q, want mixed: SIGTERM to streamd alone, not to the exec handlers' commands it waits for", unitFile, got)
	}

	cfg, err := conf.Load(exampleConfig, conf.ModeRun)
	if err != nil {
		t.Fatalf("%s: %v", exampleConfig, err)
	}
	const stopGrace = 10 * time.Second // the stop's grace and the final commit, with room to spare
	stop := unit["TimeoutStopSec"]
	if len(stop) != 1 {
		t.Fatalf("%s: TimeoutStopSec=%q, want one", unitFile, stop)
	}
	timeout, err := time.ParseDuration(stop[0])
	if err != nil {
		t.Fatalf("%s: TimeoutStopSec=%s: %v (write it as a Go duration, such as 45s)", unitFile, stop[0], err)
	}
	if need := time.Duration(cfg.ShutdownTimeout) + stopGrace; timeout < need {
		t.Errorf("%s: TimeoutStopSec=%s, want at least %s: shutdown_timeout (%s in %s) and %s more", unitFile, timeout, need, time.Duration(cfg.ShutdownTimeout), exampleConfig, stopGrace)
	}
}

// TestUnitKeepsProcessMetrics: the alert rules name process metrics
// (StreamdRestarting, process_start_time_seconds), which the Prometheus
// client computes from /proc/stat (the boot time): ProcSubset=pid hides
// that file, and the metric then vanishes from every scrape without an
// error.
func TestUnitKeepsProcessMetrics(t *testing.T) {
	if !strings.Contains(readFile(t, rulesFile), "process_start_time_seconds") {
		t.Fatalf("%s names process_start_time_seconds no more: this test may go", rulesFile)
	}
	if got := unitSettings(t, unitFile)["ProcSubset"]; len(got) > 0 && got[len(got)-1] != "all" {
		t.Errorf("%s: ProcSubset=%s hides /proc/stat, without which process_start_time_seconds is missing (StreamdRestarting never fires)", unitFile, got[len(got)-1])
	}
}

// unitSettings returns the values of each key of a systemd unit file, in
// their order, whatever their section.
func unitSettings(t *testing.T, file string) map[string][]string {
	t.Helper()
	settings := map[string][]string{}
	for _, line := range readLines(t, file) {
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=VALUE", file, line)
		}
		settings[key] = append(settings[key], value)
	}
	return settings
}

// dashboardExprs returns the expr of every query of the dashboard's panels
// and rows.
func dashboardExprs(v any) []string {
	var exprs []string
	switch v := v.(type) {
	case map[string]any:
		if e, ok := v["expr"].(string); ok {
			exprs = append(exprs, e)
		}
		for _, child := range v {
			exprs = append(exprs, dashboardExprs(child)...)
		}
	case []any:
		for _, child := range v {
			exprs = append(exprs, dashboardExprs(child)...)
		}
	}
	return exprs
}

// matchLines returns the first group of each line of file that re matches.
func matchLines(t *testing.T, file string, re *regexp.Regexp) []string {
	t.Helper()
	var found []string
	for _, line := range readLines(t, file) {
		if m := re.FindStringSubmatch(line); m != nil {
			found = append(found, m[1])
		}
	}
	return found
}

func readLines(t *testing.T, file string) []string {
	t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(readFile(t, file)))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

func readFile(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
