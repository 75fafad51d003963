package main

import (
	"strings"
	"testing"
)

func TestParseMedians(t *testing.T) {
	out := `goos: linux
cpu: Test CPU
BenchmarkDecode/payload=64KiB-2   10  100 ns/op  900.0 MB/s  0.01 allocs/record
BenchmarkDecode/payload=64KiB-2   10  100 ns/op  1000 MB/s  0.01 allocs/record
BenchmarkDecode/payload=64KiB-2   10  100 ns/op  800 MB/s  0.01 allocs/record
BenchmarkCRC/payload=64KiB-2      10  100 ns/op  1000 MB/s
PASS
`
	f, cpu, err := parse(strings.NewReader(out))
	if err != nil || cpu != "Test CPU" {
		t.Fatalf("cpu %q, err %v", cpu, err)
	}
	if v, ok := f.median("BenchmarkDecode/payload=64KiB", "MB/s"); !ok || v != 900 {
		t.Fatalf("median = %v, %v; want 900", v, ok)
	}
	if _, ok := f.median("BenchmarkDecode/payload=64B", "MB/s"); ok {
		t.Fatal("a benchmark that did not run has a median")
	}
	g := goals()[0]
	v, text, ok := g.measured(f)
	if !ok || text != "0.90×" || !g.met(v) {
		t.Fatalf("decode vs CRC: %v %q %v", v, text, ok)
	}
}
