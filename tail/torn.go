package tail

import "time"

// tornTailSaid is how long the data must end inside a frame, at the same
// offset and size, before a follower says so: an append in progress
// finishes well within it.
const tornTailSaid = 10 * time.Second

// tornState is a follower's wait at the end of the data inside a frame:
// where, the file's size then, since when, and whether it was said.
type tornState struct {
	at, size int64
	since    time.Time
	told     bool
}

// tornTail notes that the data of the open file ends inside a frame at the
// read position: a writer in the middle of an append, or one that stopped
// there (a torn tail, whose record is lost unless that writer completes
// it; streamd's next append to the file removes it). When it is still
// there, the file not grown, tornTailSaid after it was first met, it is
// logged at WARN and counted (EventTornTail), once.
func (fl *Follower) tornTail() {
	t := &fl.torn
	at, size := fl.pos(), fl.size()
	if t.since.IsZero() || t.at != at || t.size != size {
		*t = tornState{at: at, size: size, since: time.Now()}
		return
	}
	if !t.told && time.Since(t.since) >= tornTailSaid {
		t.told = true
		fl.log.Warn("the stream file ends inside a record, unchanged for 10s: a writer stopped in the middle of an append (a torn tail); "+
			"that record is lost unless its writer completes it, streamd's next append to the file removes it, and reading waits there",
			"offset", at, "size", size, "bytes", size-at)
		fl.obs.Event(EventTornTail)
	}
}

// tornPassed forgets the wait at a torn tail once the follower read past
// it, or the file changed, and says so when it was said.
func (fl *Follower) tornPassed() {
	if fl.torn.told {
		fl.log.Info("the stream file no longer ends inside a record where it did: completed, or removed by a writer; reading on", "offset", fl.torn.at)
	}
	fl.torn = tornState{}
}
