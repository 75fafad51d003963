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
// environment, in name order, so that it wins where a name is in both.
func TestExecBaseEnv(t *testing.T) {
	t.Setenv("STREAMD_TEST_BASE", "inherited")
	for _, tc := range []struct {
		name string
		env  map[string]string
		tail []string // the last entries
	}{
		{"none", nil, nil},
		{"sorted, after the inherited", map[string]string{"B": "2", "STREAMD_TEST_BASE": "configured", "A": "1"},
			[]string{"A=1", "B=2", "STREAMD_TEST_BASE=configured"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := execBaseEnv(tc.env)
			if !slices.Contains(got, "STREAMD_TEST_BASE=inherited") {
				t.Errorf("the daemon's environment is missing from %q", got)
			}
			if !slices.Equal(got[len(got)-len(tc.tail):], tc.tail) {
				t.Errorf("ends %q, want %q", got[len(got)-len(tc.tail):], tc.tail)
			}
		})
	}
}
