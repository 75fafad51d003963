package retrytimer

// entry is one pending copy. In file mode the copy stays in the spool and the
// entry only locates its record; in memory-only mode rec holds the record.
type entry struct {
	due   int64  // Unix nanoseconds; after a failed fire, the time of the next try
	delay int64  // how long before due it was scheduled (ns); unknownDelay for a type 1 record
	id    uint64 // schedule order, unique within the spool
	off   int64  // offset of the schedule record in the spool file (file mode)
	size  uint32 // body length of the schedule record (file mode)
	tries uint32 // failed fires so far
	rec   []byte // the schedule record (memory-only mode)
	line  int64  // the copy's Line, which no record keeps
	// origin is the index of the copy's Origin in the queue's table
	// (Queue.Origins), held until the copy fired; 0 in a spool's scan
	// for Check.
	origin uint32
}

// entryHeap is a [container/heap] min-heap of entries ordered by due time,
// ties broken by id, i.e. schedule order.
type entryHeap []entry

func (h entryHeap) Len() int { return len(h) }

func (h entryHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].id < h[j].id
}

func (h entryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

func (h *entryHeap) Push(x any) { *h = append(*h, x.(entry)) }

func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = entry{}
	*h = old[:len(old)-1]
	return e
}

// recordSize is the size of the entry's schedule record in the spool file.
func (e *entry) recordSize() int64 { return hdrSize + int64(e.size) }
