package retrytimer

import (
	"cmp"
	"slices"
	"sync"
)

// Origin is a group of pending copies: who made them, where they go, and
// whether [Options.Mark] marked them.
type Origin struct {
	Subscription, Stream, Key string // as the copies carry them ([Copy])
	Marked                    bool
	Copies                    int
}

// originTable interns the origins of the pending copies, so that an entry
// holds its origin as an index, and [Queue.Origins] counts them without
// reading the spool. An origin is let go of with its last copy.
type originTable struct {
	mu    sync.Mutex
	mark  func(Copy) bool // nil: none marked
	index map[Origin]uint32
	slots []originSlot // by index
	free  []uint32     // indices of empty slots
}

// originSlot is an origin (Copies 0) and how many copies hold its index.
type originSlot struct {
	origin Origin
	refs   int
}

func newOriginTable(mark func(Copy) bool) *originTable {
	return &originTable{mark: mark, index: make(map[Origin]uint32)}
}

// of returns the index of c's origin, held for c until release.
func (t *originTable) of(c *Copy) uint32 {
	o := Origin{Subscription: c.Subscription, Stream: c.Stream, Key: c.Key, Marked: t.mark != nil && t.mark(*c)}
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.index[o]
	if !ok {
		if n := len(t.free); n > 0 {
			i, t.free = t.free[n-1], t.free[:n-1]
		} else {
			i = uint32(len(t.slots))
			t.slots = append(t.slots, originSlot{})
		}
		t.index[o] = i
		t.slots[i].origin = o
	}
	t.slots[i].refs++
	return i
}

// release lets go of a copy's hold on the origin i.
func (t *originTable) release(i uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &t.slots[i]
	if s.refs--; s.refs == 0 {
		delete(t.index, s.origin)
		*s = originSlot{}
		t.free = append(t.free, i)
	}
}

// count returns the origins of entries with their counts, ordered by
// subscription, stream, key, unmarked first.
func (t *originTable) count(entries []entry) []Origin {
	counts := make(map[uint32]int)
	for _, e := range entries {
		counts[e.origin]++
	}
	t.mu.Lock()
	origins := make([]Origin, 0, len(counts))
	for i, n := range counts {
		o := t.slots[i].origin
		o.Copies = n
		origins = append(origins, o)
	}
	t.mu.Unlock()
	slices.SortFunc(origins, func(a, b Origin) int {
		return cmp.Or(cmp.Compare(a.Subscription, b.Subscription), cmp.Compare(a.Stream, b.Stream),
			cmp.Compare(a.Key, b.Key), boolCompare(a.Marked, b.Marked))
	})
	return origins
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
