package daemon

import (
	"maps"
	"slices"
	"sync"
)

// StageProgress is how far a pipe stage is through stdin: the last line it
// dealt with (its handlers answered, its copies written or delayed), and
// the lines whose copies wait in memory for their delay. A stage that
// stops before it is done says where to feed the input again from, so that
// no line is lost: the first line not done, whose copies may be lost with
// the stage. It is safe for concurrent use.
type StageProgress struct {
	mu      sync.Mutex
	last    int64
	delayed map[int64]int // line number: copies of it waiting
}

// dealt records that the stage dealt with the lines up to last.
func (p *StageProgress) dealt(last int64) {
	p.mu.Lock()
	p.last = last
	p.mu.Unlock()
}

// delay records a copy of the line the stage is at (the one after the last
// dealt with) that waits for its delay, and returns that line.
func (p *StageProgress) delay() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delayed == nil {
		p.delayed = map[int64]int{}
	}
	line := p.last + 1
	p.delayed[line]++
	return line
}

// done records that a delayed copy of line left, or was not delayed after
// all.
func (p *StageProgress) done(line int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delayed[line]--; p.delayed[line] <= 0 {
		delete(p.delayed, line)
	}
}

// Resume returns the line to feed the input to a stage again from so that
// no line is lost: the first line with a copy still waiting, else the one
// after the last line dealt with. The lines before it are done; some after
// it may be too, and a stage fed them again handles them again.
func (p *StageProgress) Resume() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resume()
}

func (p *StageProgress) resume() int64 {
	if len(p.delayed) > 0 {
		return slices.Min(slices.Collect(maps.Keys(p.delayed)))
	}
	return p.last + 1
}

// Attrs returns the log attributes of where the stage is: last_line and
// resume_line.
func (p *StageProgress) Attrs() []any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return []any{"last_line", p.last, "resume_line", p.resume()}
}
