package pipe

// Sequencer assigns the effective stream key, shard id and sequence number of
// parsed lines the way the Rust stdio consumer does: one counter per (stream
// key, shard id), starting at 0, for the whole input read by one process.
//
// The zero value is ready to use. A Sequencer is not safe for concurrent use;
// it keeps one counter for every (stream key, shard id) it has seen, as Rust
// does.
type Sequencer struct {
	streams map[string]*streamCounters
}

// streamCounters holds the counters of one stream key.
type streamCounters struct {
	key    string            // the stream key, allocated once
	shards map[uint64]uint64 // next sequence number by shard id
}

// Assign returns the effective stream key, shard id and sequence number of l
// and advances the counter. A missing stream key is [BroadcastKey], which
// shares its counter with lines that name it; a missing shard id is 0. A
// line with sequence N sets the counter to N (not N+1) and gets N; a line
// without gets the counter's value and increments it, wrapping from the
// maximum to 0 as a release build of the Rust consumer does.
//
// Assign reads l and keeps no reference to it. The returned key does not
// alias l.StreamKey, and Assign allocates only for a stream key or shard id
// it has not seen before.
func (s *Sequencer) Assign(l *Line) (streamKey string, shardID, sequence uint64) {
	if s.streams == nil {
		s.streams = make(map[string]*streamCounters)
	}
	var c *streamCounters
	if l.HasStreamKey {
		c = s.streams[string(l.StreamKey)]
		if c == nil {
			c = s.add(string(l.StreamKey))
		}
	} else {
		c = s.streams[BroadcastKey]
		if c == nil {
			c = s.add(BroadcastKey)
		}
	}
	if l.HasShardID {
		shardID = l.ShardID
	}
	if l.HasSequence {
		sequence = l.Sequence
		c.shards[shardID] = sequence
	} else {
		sequence = c.shards[shardID]
		c.shards[shardID] = sequence + 1
	}
	return c.key, shardID, sequence
}

// add creates the counters of a stream key seen for the first time.
func (s *Sequencer) add(key string) *streamCounters {
	c := &streamCounters{key: key, shards: make(map[uint64]uint64)}
	s.streams[key] = c
	return c
}
