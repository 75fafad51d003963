// Package handler defines what a subscription hands each record to: a
// [Handler] receives a [Delivery] and returns an [Outcome] (ack, drop,
// retry, retry_after, or failed when it could not decide). It holds the
// kinds a configuration names (http, exec, stdout, discard), built by
// [New]; programs that embed the daemon pass a [HandlerFunc]. Handlers know
// nothing of subscriptions or files: the daemon settles their outcomes.
package handler

import (
	"context"
	"strconv"
	"time"

	"github.com/streamd/streamd/envelope"
)

// OutcomeKind is what a handler decided about a delivery.
type OutcomeKind uint8

// The outcomes of settlement.md §1, plus Failed for a transport failure.
const (
	// OutcomeAck: done. The file transport cannot acknowledge, so this is
	// counted as an unsupported settlement and nothing is written.
	OutcomeAck OutcomeKind = iota
	// OutcomeDrop: give up on the record; never sent to the dead letter.
	OutcomeDrop
	// OutcomeRetry: deliver again at once (a copy), when the subscription
	// declares max_attempts or dead_letter; otherwise unsupported.
	OutcomeRetry
	// OutcomeRetryAfter: deliver again after Outcome.Delay (a copy).
	OutcomeRetryAfter
	// OutcomeFailed: the handler could not be reached or failed for a
	// reason that may pass (a refused connection, a timeout, a 5xx, exit
	// status 75). Settled as OutcomeRetryAfter with the subscription's next
	// backoff step, so a failing transport never burns all attempts at once.
	OutcomeFailed
)

var outcomeNames = [...]string{"ack", "drop", "retry", "retry_after", "failed"}

func (k OutcomeKind) String() string {
	if int(k) < len(outcomeNames) {
		return outcomeNames[k]
	}
	return "unknown"
}

// Outcome is a handler's answer for one delivery.
type Outcome struct {
	Kind  OutcomeKind
	Delay time.Duration // for OutcomeRetryAfter
	Err   error         // why, for OutcomeFailed (logged)
}

// Delivery is one record handed to a handler.
type Delivery struct {
	Subscription string
	Key          string
	Shard        uint64
	Seq          uint64
	TimestampMs  uint64
	// Headers are the record's envelope headers, with stream-sequence set
	// to Seq.
	Headers envelope.Headers
	// Payload is the record's payload without the envelope. It is valid
	// only until Handle returns.
	Payload []byte
	// Attempt is 1 for the first delivery, and one more than the
	// x-ruststream-retry-count header of a copy.
	Attempt uint64
}

// deliveryMeta is the metadata of a delivery that the exec and http
// handlers pass besides the payload and the record headers, in the order
// they pass it, with the name each gives it: an environment variable, a
// request header. appendValue appends the value as text: the subscription's
// name, the stream key, or a number in decimal.
var deliveryMeta = [...]struct {
	env, header string
	appendValue func(b []byte, d *Delivery) []byte
}{
	{"STREAMD_SUBSCRIPTION", "Streamd-Subscription", func(b []byte, d *Delivery) []byte { return append(b, d.Subscription...) }},
	{"STREAMD_STREAM_KEY", "Streamd-Stream-Key", func(b []byte, d *Delivery) []byte { return append(b, d.Key...) }},
	{"STREAMD_SEQ", "Streamd-Seq", func(b []byte, d *Delivery) []byte { return strconv.AppendUint(b, d.Seq, 10) }},
	{"STREAMD_SHARD", "Streamd-Shard", func(b []byte, d *Delivery) []byte { return strconv.AppendUint(b, d.Shard, 10) }},
	{"STREAMD_TIMESTAMP_MS", "Streamd-Timestamp-Ms", func(b []byte, d *Delivery) []byte { return strconv.AppendUint(b, d.TimestampMs, 10) }},
	{"STREAMD_ATTEMPT", "Streamd-Attempt", func(b []byte, d *Delivery) []byte { return strconv.AppendUint(b, d.Attempt, 10) }},
}

// Handler handles deliveries. Handle may be called from several goroutines
// at once when a subscription's concurrency is above 1. It must return when
// ctx ends; what it returns then is settled like any outcome.
type Handler interface {
	Handle(ctx context.Context, d *Delivery) Outcome
}

// HandlerFunc adapts a function to a Handler, for programs that embed the
// daemon.
type HandlerFunc func(ctx context.Context, d *Delivery) Outcome

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d *Delivery) Outcome { return f(ctx, d) }
