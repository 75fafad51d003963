package handler

import (
	"slices"
	"testing"
)

func TestExecEnvName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"content-type", "CONTENT_TYPE"},
		{"X.Trace id", "X_TRACE_ID"},
		{"é9", "__9"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := envName(tt.in); got != tt.want {
			t.Errorf("envName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestExecBaseEnv: the configured env comes after the daemon's own
// environment, in name order, so that it wins where a name is in both; the
// daemon's record header variables are left out, the configured ones kept.
func TestExecBaseEnv(t *testing.T) {
	t.Setenv("STREAMD_TEST_BASE", "inherited")
	t.Setenv("STREAMD_HEADER_STALE", "outer")
	t.Setenv("STREAMD_BASE64_HEADER_STALE", "b3V0ZXI=")
	for _, tc := range []struct {
		name string
		env  map[string]string
		tail []string // the last entries
	}{
		{"none", nil, nil},
		{"sorted, after the inherited", map[string]string{"B": "2", "STREAMD_TEST_BASE": "configured", "A": "1"},
			[]string{"A=1", "B=2", "STREAMD_TEST_BASE=configured"}},
		{"a configured header variable", map[string]string{"STREAMD_HEADER_STALE": "configured"},
			[]string{"STREAMD_HEADER_STALE=configured"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := execBaseEnv(tc.env)
			if !slices.Contains(got, "STREAMD_TEST_BASE=inherited") {
				t.Errorf("the daemon's environment is missing from %q", got)
			}
			for _, kv := range []string{"STREAMD_HEADER_STALE=outer", "STREAMD_BASE64_HEADER_STALE=b3V0ZXI="} {
				if slices.Contains(got, kv) {
					t.Errorf("the inherited %s is passed on", kv)
				}
			}
			if !slices.Equal(got[len(got)-len(tc.tail):], tc.tail) {
				t.Errorf("ends %q, want %q", got[len(got)-len(tc.tail):], tc.tail)
			}
		})
	}
}
