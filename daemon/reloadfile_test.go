package daemon

import (
	"strings"
	"testing"
)

// TestReloadResultPrint: an answer that applied the new configuration is
// said on stdout, a refusal with the daemon's reason on stderr.
func TestReloadResultPrint(t *testing.T) {
	for _, tc := range []struct {
		name        string
		result      ReloadResult
		runs        bool
		out, errOut string
	}{
		{name: "applied", result: ReloadResult{PID: 42}, runs: true,
			out: "streamd reload: streamd (pid 42) runs the new configuration\n"},
		{name: "refused", result: ReloadResult{PID: 42, Error: "commit_interval changed from 100ms to 200ms: restart required"},
			errOut: "streamd reload: streamd (pid 42) refused the new configuration; the previous one keeps running:\ncommit_interval changed from 100ms to 200ms: restart required\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			if runs := tc.result.Print(&out, &errOut); runs != tc.runs {
				t.Errorf("Print reported %v, want %v", runs, tc.runs)
			}
			if out.String() != tc.out || errOut.String() != tc.errOut {
				t.Errorf("stdout %q, stderr %q; want %q, %q", out.String(), errOut.String(), tc.out, tc.errOut)
			}
		})
	}
}
