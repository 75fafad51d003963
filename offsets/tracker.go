package offsets

import (
	"context"
	"fmt"
	"sync"

	"github.com/streamd/streamd/internal/wakeup"
)

// Mark is a place in a stream file: the offset of the next frame to read
// and the sequence number of the last record before it.
type Mark struct {
	Offset int64
	Seq    uint64
}

// Ticket identifies one record handed out by a [Tracker].
type Ticket uint64

// Tracker computes the low watermark of one subscription: records are
// handed out in file order, settle in any order, and [Tracker.Committable]
// is the end of the longest prefix of them that has settled, the only
// position that may be stored (Invariant 1).
//
// It keeps the records from the oldest unsettled one to the newest in a
// ring of fixed size, the window: Begin and Settle are O(1) amortized and
// allocate nothing, and memory stays bounded however long one slow record
// holds the watermark back, because Begin waits while the window is full.
// That wait is the back-pressure that reaches the reader.
//
// A Tracker is safe for concurrent use; a mutex guards it, held only for a
// few instructions. File order is the caller's to keep, so Begin is called
// from one goroutine, the reader; handler goroutines call Settle and the
// committer calls Committable.
type Tracker struct {
	mu      sync.Mutex
	ring    []slot // ring[head] is the record with ticket first
	head    int
	base    Ticket        // ticket of the first record, fixed (Owns)
	first   Ticket        // ticket of the oldest record in the window
	next    Ticket        // ticket the next Begin returns
	lastEnd int64         // end of the newest record handed out
	mark    Mark          // end of the settled prefix
	space   wakeup.Signal // woken when the window shrinks
}

type slot struct {
	start, end int64
	seq, tag   uint64
	settled    bool
}

// Span is one record handed out: the bytes [Start, End) of a stream file,
// its sequence number, and the tag [Tracker.BeginTagged] gave it, which
// tells it from another record written at the same offsets, as in a file
// written again in place.
type Span struct {
	Start, End int64
	Seq, Tag   uint64
}

// NewTracker returns a Tracker whose settled prefix ends at from, typically
// the stored position the subscription resumes at, and that holds at most
// window records (at least 1) from the oldest unsettled one to the newest.
// A window of the subscription's concurrency keeps every handler busy only
// while records settle in order; a larger one lets fast records run ahead
// of a slow one. Its memory is a few words per record of window.
func NewTracker(from Mark, window int) *Tracker {
	return &Tracker{
		ring:    make([]slot, max(window, 1)),
		lastEnd: from.Offset,
		mark:    from,
	}
}

// Continued returns a Tracker, as NewTracker does, for the records of the
// file read after t's, while records of t may still settle: its tickets
// follow t's, so that [Tracker.Owns] tells whose a ticket is.
func (t *Tracker) Continued(from Mark, window int) *Tracker {
	t.mu.Lock()
	next := t.next
	t.mu.Unlock()
	c := NewTracker(from, window)
	c.base, c.first, c.next = next, next, next
	return c
}

// Owns reports whether ticket was handed out by t rather than by a Tracker
// that t continues (Continued).
func (t *Tracker) Owns(ticket Ticket) bool { return ticket >= t.base }

// Settled reports whether every record handed out has settled.
func (t *Tracker) Settled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.first == t.next
}

// Begin hands out the record that spans the bytes [start, end) of the file
// and has sequence number seq, and returns its ticket for Settle. Records
// must come in file order: start must not be before the end of the
// previous record (or the Tracker's start), and end must be after start.
// Gaps are allowed, for frames the subscription passes over. Begin waits
// while the window is full, and returns ctx's error if ctx ends first.
func (t *Tracker) Begin(ctx context.Context, start, end int64, seq uint64) (Ticket, error) {
	return t.BeginTagged(ctx, start, end, seq, 0)
}

// BeginTagged is Begin for a record that [Tracker.SettledAhead] tells by
// tag too.
func (t *Tracker) BeginTagged(ctx context.Context, start, end int64, seq, tag uint64) (Ticket, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.waitWhile(ctx, func() bool { return int(t.next-t.first) == len(t.ring) }); err != nil {
		return 0, err
	}
	if start < t.lastEnd || end <= start {
		return 0, fmt.Errorf("offsets: tracker: record [%d, %d) is out of file order after offset %d", start, end, t.lastEnd)
	}
	t.ring[t.index(t.next)] = slot{start: start, end: end, seq: seq, tag: tag}
	t.lastEnd = end
	ticket := t.next
	t.next++
	return ticket, nil
}

// Settle marks the record of ticket as settled: its outcome is final. It
// fails for a ticket not handed out, or settled already.
func (t *Tracker) Settle(ticket Ticket) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ticket >= t.next {
		return fmt.Errorf("offsets: tracker: settle %d: never handed out", ticket)
	}
	// Records before the window settled and left it.
	if ticket < t.first || t.ring[t.index(ticket)].settled {
		return fmt.Errorf("offsets: tracker: settle %d: settled already", ticket)
	}
	t.ring[t.index(ticket)].settled = true
	if ticket != t.first {
		return nil
	}
	for t.first < t.next && t.ring[t.head].settled {
		oldest := t.ring[t.head]
		t.mark = Mark{Offset: oldest.end, Seq: oldest.seq}
		t.first++
		t.head++
		if t.head == len(t.ring) {
			t.head = 0
		}
	}
	t.space.Wake()
	return nil
}

// Wait returns once every record handed out has settled, or with ctx's
// error if ctx ends first.
func (t *Tracker) Wait(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waitWhile(ctx, func() bool { return t.first != t.next })
}

// waitWhile waits, with t.mu held on entry and return, until cond is false
// after a Settle moved the window, or ctx ends.
func (t *Tracker) waitWhile(ctx context.Context, cond func() bool) error {
	for cond() {
		space := t.space.C()
		t.mu.Unlock()
		select {
		case <-space:
			t.mu.Lock()
		case <-ctx.Done():
			t.mu.Lock()
			return ctx.Err()
		}
	}
	return nil
}

// Committable returns the end of the longest settled prefix of the records
// handed out, and the sequence number of its last record; the Tracker's
// start while that prefix is empty.
func (t *Tracker) Committable() Mark {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mark
}

// End returns the end of the newest record handed out, the Tracker's start
// if none was.
func (t *Tracker) End() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastEnd
}

// SettledAhead returns the records that settled after the oldest unsettled
// one, in file order: those a start at [Tracker.Committable] reads again.
func (t *Tracker) SettledAhead() []Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	var spans []Span
	for ticket := t.first; ticket < t.next; ticket++ {
		if s := t.ring[t.index(ticket)]; s.settled {
			spans = append(spans, Span{Start: s.start, End: s.end, Seq: s.seq, Tag: s.tag})
		}
	}
	return spans
}

// index returns the ring slot of a ticket in the window.
func (t *Tracker) index(ticket Ticket) int {
	i := t.head + int(ticket-t.first)
	if i >= len(t.ring) {
		i -= len(t.ring)
	}
	return i
}
