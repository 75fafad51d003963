package pipe

import (
	"math"
	"testing"
)

// TestSequencer checks counter assignment over sequences of lines read by one
// process (spec §3).
func TestSequencer(t *testing.T) {
	type effective struct {
		key   string
		shard uint64
		seq   uint64
	}
	tests := []struct {
		name  string
		lines []string
		want  []effective
	}{
		{
			name:  "defaults",
			lines: []string{"plain", "[2022-01-01T00:00:00] ts only", ""},
			want:  []effective{{"broadcast", 0, 0}, {"broadcast", 0, 1}, {"broadcast", 0, 2}},
		},
		{
			name:  "explicit broadcast shares the counter",
			lines: []string{"[broadcast] a", "plain", "[broadcast | 9] b", "plain"},
			want:  []effective{{"broadcast", 0, 0}, {"broadcast", 0, 1}, {"broadcast", 0, 9}, {"broadcast", 0, 9}},
		},
		{
			name:  "explicit sequence sets the counter to N",
			lines: []string{"[k | 5] a", "[k] b", "[k] c", "[k | 2] d", "[k] e"},
			want:  []effective{{"k", 0, 5}, {"k", 0, 5}, {"k", 0, 6}, {"k", 0, 2}, {"k", 0, 2}},
		},
		{
			name:  "counters per key and shard",
			lines: []string{"[a] 1", "[b] 1", "[a | 3 | 1] 2", "[a] 3", "[b] 2", "[a | 7 | 1] 4"},
			want:  []effective{{"a", 0, 0}, {"b", 0, 0}, {"a", 1, 3}, {"a", 0, 1}, {"b", 0, 1}, {"a", 1, 7}},
		},
		{
			name:  "counter wraps after the maximum",
			lines: []string{"[k | 18446744073709551615] a", "[k] b", "[k] c"},
			want:  []effective{{"k", 0, math.MaxUint64}, {"k", 0, math.MaxUint64}, {"k", 0, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Sequencer
			for i, line := range tt.lines {
				l, err := ParseLine([]byte(line))
				if err != nil {
					t.Fatal(err)
				}
				key, shard, seq := s.Assign(&l)
				if got := (effective{key, shard, seq}); got != tt.want[i] {
					t.Errorf("line %d %q: got %+v, want %+v", i+1, line, got, tt.want[i])
				}
			}
		})
	}
}

// TestSequencerKeyOwnership checks that the returned key does not alias the
// line and that known keys cost no allocation.
func TestSequencerKeyOwnership(t *testing.T) {
	var s Sequencer
	buf := []byte("[key] x")
	l, err := ParseLine(buf)
	if err != nil {
		t.Fatal(err)
	}
	key, _, _ := s.Assign(&l)
	copy(buf, "[KEY] x")
	if key != "key" {
		t.Errorf("key = %q after reusing the buffer, want %q", key, "key")
	}
	if allocs := testing.AllocsPerRun(100, func() { s.Assign(&l) }); allocs != 0 {
		t.Errorf("Assign on a known key allocated %v times, want 0", allocs)
	}
}
