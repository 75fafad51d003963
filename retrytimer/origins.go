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

// originTable interns the origins of the copies scheduled or loaded, so
// that an entry holds its origin as an index, and [Queue.Origins] counts
// them without reading the spool. It only grows: a configuration names
// few origins.
type originTable struct {
	mu    sync.Mutex
	mark  func(Copy) bool // nil: none marked
	index map[Origin]uint32
	list  []Origin // by index, Copies 0
}

func newOriginTable(mark func(Copy) bool) *originTable {
	return &originTable{mark: mark, index: make(map[Origin]uint32)}
}

// of returns the index of c's origin.
func (t *originTable) of(c *Copy) uint32 {
	o := Origin{Subscription: c.Subscription, Stream: c.Stream, Key: c.Key, Marked: t.mark != nil && t.mark(*c)}
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.index[o]
	if !ok {
		i = uint32(len(t.list))
		t.index[o] = i
		t.list = append(t.list, o)
	}
	return i
}

// count returns the origins of entries with their counts, those with none
// left out, ordered by subscription, stream, key, unmarked first.
func (t *originTable) count(entries []entry) []Origin {
	t.mu.Lock()
	counts := slices.Clone(t.list)
	t.mu.Unlock()
	for _, e := range entries {
		counts[e.origin].Copies++
	}
	counts = slices.DeleteFunc(counts, func(o Origin) bool { return o.Copies == 0 })
	slices.SortFunc(counts, func(a, b Origin) int {
		return cmp.Or(cmp.Compare(a.Subscription, b.Subscription), cmp.Compare(a.Stream, b.Stream),
			cmp.Compare(a.Key, b.Key), boolCompare(a.Marked, b.Marked))
	})
	return counts
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
