package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// benchPipeLineSize is the size of one input line of BenchmarkPipeDiscard,
// its '\n' included.
const benchPipeLineSize = 100

// benchPipeLines returns n stdio lines "[jobs] <payload>" of
// benchPipeLineSize bytes each.
func benchPipeLines(n int) []byte {
	b := make([]byte, 0, n*benchPipeLineSize)
	for i := range n {
		start := len(b)
		b = fmt.Appendf(b, `[jobs] {"id":%d,"pad":"`, i)
		for len(b)-start < benchPipeLineSize-3 {
			b = append(b, 'x')
		}
		b = append(b, "\"}\n"...)
	}
	return b
}

// BenchmarkPipeDiscard pipes 1 000 000 lines of 100 bytes through the real
// binary, built without -race, running `streamd pipe` with a discard
// handler, stdout to io.Discard. It reports lines/s, start-up included
// (the acceptance floor is 300 000 lines/s), and lines per second of the
// stage's CPU time.
func BenchmarkPipeDiscard(b *testing.B) {
	dir := b.TempDir()
	bin := benchBinary(b)
	cfg := filepath.Join(dir, "pipe.toml")
	if err := os.WriteFile(cfg, []byte(`
[[subscription]]
name = "jobs"
key = "jobs"
out_retry = "jobs.retry"
[subscription.handler]
kind = "discard"
`), 0o644); err != nil {
		b.Fatal(err)
	}
	const n = 1_000_000
	input := benchPipeLines(n)
	if len(input) != n*benchPipeLineSize {
		b.Fatalf("input is %d bytes, want %d", len(input), n*benchPipeLineSize)
	}
	b.SetBytes(int64(len(input)))
	var cpu time.Duration // the stage's user and system time
	for b.Loop() {
		cmd := exec.Command(bin, "pipe", "--config.file="+cfg, "--log.format=text")
		cmd.Stdin = bytes.NewReader(input)
		cmd.Stdout = io.Discard
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			b.Fatalf("streamd pipe: %v\n%s", err, stderr.String())
		}
		if s := stderr.String(); strings.Contains(s, "level=ERROR") || strings.Contains(s, "invalid stdin line") {
			b.Fatalf("streamd pipe logged:\n%s", s)
		}
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
	// Lines per second of the stage's own CPU time, which the load of a
	// shared machine disturbs less than the wall clock.
	b.ReportMetric(float64(n)*float64(b.N)/cpu.Seconds(), "lines/cpu-s")
}
