package tail

// Observer is told what a [Follower] reads and what happens to its file,
// for metrics. Its methods are called on the goroutine that calls
// [Follower.Next] or [Follower.Close], one at a time; they must return
// quickly and must not call the Follower.
type Observer interface {
	// Read reports records delivered since the last call, and the bytes
	// the read position moved over (frames, and the beacons between
	// them). It is called before the follower waits, every MiB while it
	// catches up, when it changes files and when it stops.
	Read(records, bytes int64)
	// Event reports one event; each is logged as well.
	Event(e Event)
	// Trouble reports that a live follower cannot read on because of the
	// file at its path, with an error that names the file and the
	// problem: it is not a stream file, reading it fails, or it replaced
	// the file read and cannot be opened (no permission, not a regular
	// file). It is called when a trouble begins or its error changes, and
	// with nil once none lasts: the follower reads on by itself then (a
	// replay fails instead). Each is logged as well.
	Trouble(err error)
}

// Event is something that happened to a followed file or its watch.
type Event uint8

// The events an [Observer] is told about.
const (
	// EventOverflow: the notification queue overflowed. The follower then
	// looks at the file as a poll would, so nothing is missed.
	EventOverflow Event = iota + 1
	// EventPollRead: the poll interval passed without a notification and
	// the file had changed (in poll-only mode, every change is found so).
	EventPollRead
	// EventTruncated: the file shrank below the read position, or was
	// rewritten in place with a new header, or a stored position does not
	// fit it; it is read from its beginning.
	EventTruncated
	// EventReplaced: the path names another file (renamed over, or
	// deleted and created again), or a stored position belongs to another
	// file. The old file was read to its end; the new one is read from its
	// beginning. Counted once per file switched to: a file rotated in
	// between, then the one at the path, count twice.
	EventReplaced
	// EventRemoved: the path no longer exists. The follower keeps the old
	// file open and waits for the path to come back.
	EventRemoved
	// EventTornTail: a replaced file ended inside a frame, which is lost;
	// or the open file has ended inside one, unchanged, for 10 s (a writer
	// stopped in the middle of an append).
	EventTornTail
	// EventChecksum: a frame's payload does not match its checksum.
	EventChecksum
	// EventFormat: bytes where a frame should be are not one.
	EventFormat
	// EventUnreadable: reading the open file failed (an I/O error). A live
	// follower tries the same read again at each wake-up; counted once per
	// spell of failures.
	EventUnreadable
	// EventLost: records were lost to the follower, told besides the
	// event of what happened (logged at ERROR): the file of a stored
	// position is gone (EventReplaced), the file was truncated before they
	// were read, or the copy of a truncated file ends before the file did
	// (EventTruncated).
	EventLost
)

var eventNames = [...]string{
	EventOverflow:   "overflow",
	EventPollRead:   "poll_read",
	EventTruncated:  "truncated",
	EventReplaced:   "replaced",
	EventRemoved:    "removed",
	EventTornTail:   "torn_tail",
	EventChecksum:   "checksum",
	EventFormat:     "format",
	EventUnreadable: "unreadable",
	EventLost:       "lost",
}

// String returns the event's name in snake_case, fit for a metric label.
func (e Event) String() string {
	if int(e) < len(eventNames) && eventNames[e] != "" {
		return eventNames[e]
	}
	return "unknown"
}

// Events lists every event, for pre-initialising metric labels.
var Events = []Event{EventOverflow, EventPollRead, EventTruncated, EventReplaced, EventRemoved, EventTornTail, EventChecksum, EventFormat, EventUnreadable, EventLost}

type nopObserver struct{}

func (nopObserver) Read(int64, int64) {}
func (nopObserver) Event(Event)       {}
func (nopObserver) Trouble(error)     {}
