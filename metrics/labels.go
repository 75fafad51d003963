package metrics

import "strconv"

// Reason is why a subscription's reader counted a read error: the reason
// label of streamd_read_errors_total. It indexes
// [SubscriptionMetrics.ReadErrors].
type Reason int

// The read error reasons.
const (
	// ReasonChecksum: a frame's payload does not match its checksum.
	ReasonChecksum Reason = iota
	// ReasonFormat: bytes where a frame should be are not one.
	ReasonFormat
	// ReasonLost: records were lost to the subscription: the file of its
	// stored position is gone, the file was truncated before they were
	// read, or the copy of a truncated file ends before the file did.
	ReasonLost
	// ReasonRemoval: no stream file is at the path where a subscription
	// starts: it waits for one.
	ReasonRemoval
	// ReasonTornTail: a replaced file ended inside a frame, which is lost.
	ReasonTornTail
	// ReasonOverflow: the file notification queue of the subscription's
	// reader overflowed; the file was looked at as a poll would.
	ReasonOverflow
	// ReasonInvalidLine: a stdin line that is not a valid stdio line
	// (streamd pipe).
	ReasonInvalidLine
	// ReasonUnreadable: reading the stream file failed with an I/O error;
	// counted once per spell of failures, which the reader waits out.
	ReasonUnreadable
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonChecksum:    "checksum",
	ReasonFormat:      "format",
	ReasonLost:        "lost",
	ReasonRemoval:     "removal",
	ReasonTornTail:    "torn_tail",
	ReasonOverflow:    "overflow",
	ReasonInvalidLine: "invalid_line",
	ReasonUnreadable:  "unreadable",
}

// Change is what happened to the file at a subscription's stream path
// that its reader went through, routine with rotations (lost records are
// read errors, [ReasonLost]): the change label of
// streamd_stream_file_changes_total. It indexes
// [SubscriptionMetrics.FileChanges].
type Change int

// The file changes.
const (
	// ChangeReplaced: the path names another file than the one read (a
	// rotation, or a file put there), or a stored position belongs to
	// another file.
	ChangeReplaced Change = iota
	// ChangeRemoved: the path no longer names a file (between a
	// rotation's rename and the next file's creation).
	ChangeRemoved
	// ChangeTruncated: the file shrank below the read position (a
	// copytruncate), was rewritten in place, or a stored position does
	// not fit it; it is read from its beginning.
	ChangeTruncated
	numChanges
)

var changeNames = [numChanges]string{
	ChangeReplaced:  "replaced",
	ChangeRemoved:   "removed",
	ChangeTruncated: "truncated",
}

// Outcome is what became of a delivery at its subscription's handler: the
// outcome label of streamd_handler_records_total. It indexes
// [SubscriptionMetrics.HandlerRecords].
type Outcome int

// The handler outcomes.
const (
	// OutcomeAck: the handler returned ack.
	OutcomeAck Outcome = iota
	// OutcomeDrop: the handler returned drop.
	OutcomeDrop
	// OutcomeRetry: the handler returned retry.
	OutcomeRetry
	// OutcomeRetryAfter: the handler returned retry_after(d).
	OutcomeRetryAfter
	// OutcomeFailed: the handler failed without an outcome and the
	// delivery was left unsettled (the fail_fast policy).
	OutcomeFailed
	// OutcomeForeignCopy: the record is a copy made for another
	// subscription of this daemon; it was passed over, never handed to the
	// handler.
	OutcomeForeignCopy
	// OutcomeDecodeError: the delivery could not be decoded for the
	// handler; the decode policy settled it.
	OutcomeDecodeError
	// OutcomePanic: the handler panicked; the panic policy settled it.
	OutcomePanic
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	OutcomeAck:         "ack",
	OutcomeDrop:        "drop",
	OutcomeRetry:       "retry",
	OutcomeRetryAfter:  "retry_after",
	OutcomeFailed:      "failed",
	OutcomeForeignCopy: "foreign_copy",
	OutcomeDecodeError: "decode_error",
	OutcomePanic:       "panic",
}

// Operation is a settlement that the transport cannot perform (see
// spec/settlement.md §2 and §4.1): the operation label of
// streamd_handler_unsupported_total. It indexes
// [SubscriptionMetrics.Unsupported].
type Operation int

// The unsupported settlement operations.
const (
	// OperationAck: an ack, which the transport cannot acknowledge.
	OperationAck Operation = iota
	// OperationDrop: a drop, which the transport cannot acknowledge either.
	OperationDrop
	// OperationRetry: a retry on a subscription that declares neither
	// max_attempts nor dead_letter; nothing is written.
	OperationRetry
	// OperationReject: the retry cap was reached with no dead-letter key;
	// nothing is written.
	OperationReject
	numOperations
)

var operationNames = [numOperations]string{
	OperationAck:    "ack",
	OperationDrop:   "drop",
	OperationRetry:  "retry",
	OperationReject: "reject",
}

// String returns the reason's label value.
func (r Reason) String() string { return labelValue(r, reasonNames[:], "Reason") }

// String returns the change's label value.
func (c Change) String() string { return labelValue(c, changeNames[:], "Change") }

// String returns the outcome's label value.
func (o Outcome) String() string { return labelValue(o, outcomeNames[:], "Outcome") }

// String returns the operation's label value.
func (o Operation) String() string { return labelValue(o, operationNames[:], "Operation") }

// labelValue returns names[v], the label value of v, or "typ(v)" for a
// value out of range.
func labelValue[T ~int](v T, names []string, typ string) string {
	if v >= 0 && int(v) < len(names) {
		return names[v]
	}
	return typ + "(" + strconv.Itoa(int(v)) + ")"
}

// The result label values of streamd_offset_commits_total.
const (
	resultSuccess = "success"
	resultFailure = "failure"
)
