// Package deploy_test checks the files operators deploy next to streamd:
// the Prometheus alert rules (deploy/prometheus) and the Grafana dashboard
// (deploy/grafana).
package deploy_test

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

const (
	rulesFile     = "prometheus/streamd.rules.yml"
	rulesTestFile = "prometheus/streamd.rules.test.yml"
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
