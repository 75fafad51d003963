package daemon

import (
	"maps"
	"slices"
	"sync"
)

// StageProgress is how far a pipe stage is through stdin: the last line it
// dealt with (its handlers answered, its copies written, delayed or lost),
// and the lines not done: a copy of theirs waits in memory for its delay,
// or was lost. A stage that stops before it is done says where to feed the
// input again from, so that no line is lost: the first line not done. It
// is safe for concurrent use.
type StageProgress struct {
	mu     sync.Mutex
	last   int64
	undone map[int64]int // line number: copies of it not written
}

// dealt records that the stage dealt with the lines up to last.
func (p *StageProgress) dealt(last int64) {
	p.mu.Lock()
	p.last = last
	p.mu.Unlock()
}

// delay records a copy that waits for its delay, of the line the stage is
// handling (the one after the last dealt with: a stage handles one line at
// a time, and its copies are made while it does), and returns that line.
func (p *StageProgress) delay() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.undone == nil {
		p.undone = map[int64]int{}
	}
	line := p.last + 1
	p.undone[line]++
	return line
}

// lose records a copy of the line the stage is handling that could not be
// written: the line is never done.
func (p *StageProgress) lose() { p.delay() }

// done records that a delayed copy of line left.
func (p *StageProgress) done(line int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.undone[line] <= 1 {
		delete(p.undone, line)
		return
	}
	p.undone[line]--
}

// Resume returns the line to feed the input to a stage again from so that
// no line is lost: the first line not done, else the one after the last
// line dealt with. The lines before it are done; some after
// it may be too, and a stage fed them again handles them again.
func (p *StageProgress) Resume() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resume()
}

func (p *StageProgress) resume() int64 {
	if len(p.undone) > 0 {
		return slices.Min(slices.Collect(maps.Keys(p.undone)))
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
