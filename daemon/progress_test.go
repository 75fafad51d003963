package daemon

import (
	"slices"
	"testing"
)

// TestStageProgress: the line to feed the input again from is the first
// whose copy still waits, else the one after the last dealt with.
func TestStageProgress(t *testing.T) {
	var p StageProgress
	if got := p.Resume(); got != 1 {
		t.Fatalf("Resume of a new stage = %d, want 1", got)
	}
	p.dealt(2)
	three := p.delay() // a copy of line 3, the one the stage is at
	p.dealt(3)
	p.delay() // line 4's
	p.delay() // and another of it
	four := p.delay()
	p.dealt(9)
	steps := []struct {
		done int64 // a copy of that line left; 0: none
		want int64
	}{
		{0, 3},
		{three, 4},
		{four, 4}, // two copies of line 4 wait still
		{four, 4},
		{four, 10},
	}
	for i, s := range steps {
		if s.done != 0 {
			p.done(s.done)
		}
		if got := p.Resume(); got != s.want {
			t.Errorf("step %d: Resume = %d, want %d", i, got, s.want)
		}
	}
	if three != 3 || four != 4 {
		t.Errorf("delay returned lines %d and %d, want 3 and 4", three, four)
	}
	if got, want := p.Attrs(), []any{"last_line", int64(9), "resume_line", int64(10)}; !slices.Equal(got, want) {
		t.Errorf("Attrs = %v, want %v", got, want)
	}
}

// TestStageProgressLost: a line one of whose copies was lost is never
// done, however its delayed ones leave; a done of a line with no copy
// waiting changes nothing.
func TestStageProgressLost(t *testing.T) {
	var p StageProgress
	p.done(5)
	p.dealt(1)
	line := p.delay() // a copy of line 2 waits
	p.lose()          // and another of it is lost
	p.dealt(7)
	p.done(line)
	if got := p.Resume(); got != 2 {
		t.Errorf("Resume = %d, want 2: a copy of line 2 was lost", got)
	}
}
