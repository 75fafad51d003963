// Package handler defines what a subscription hands each record to: a
// [Handler] receives a [Delivery] and returns an [Outcome] (ack, drop,
// retry, retry_after, or failed when it could not decide). It holds the
// kinds a configuration names (http, exec, stdout, discard, nats), built by
// [New]; programs that embed the daemon pass a [HandlerFunc]. Handlers know
// nothing of subscriptions or files: the daemon settles their outcomes.
package handler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/streamfile"
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
	// OutcomeFailed: not an answer but a failed delivery: the handler
	// could not decide (a refused connection, a timeout, a 5xx, an exec
	// that could not start or was killed, exit status 75). The record is
	// delivered again in place after the subscription's next backoff step,
	// or after Outcome.Delay when the handler names one (Retry-After): no
	// copy is written and its position does not move past it.
	OutcomeFailed
)

var outcomeNames = [...]string{"ack", "drop", "retry", "retry_after", "failed"}

func (k OutcomeKind) String() string {
	if int(k) < len(outcomeNames) {
		return outcomeNames[k]
	}
	return "unknown"
}

// Outcome is a handler's answer for one delivery, or its failure.
type Outcome struct {
	Kind OutcomeKind
	// Delay is the delay of OutcomeRetryAfter, and for OutcomeFailed the
	// time the handler asks to wait before the next delivery (Retry-After);
	// 0 for the next backoff step.
	Delay time.Duration
	// Failure classifies an OutcomeFailed, and Err says what failed; for
	// an OutcomeDrop, Err, when set, says why the handler dropped the
	// record (an HTTP status), and the daemon logs it.
	Failure Failure
	Err     error
	// Duplicate marks an ack of a record the destination already held
	// (a JetStream duplicate acknowledgement): it was forwarded before a
	// crash or restart and is not stored twice.
	Duplicate bool
}

// Failure is why a delivery failed: the reason label of
// streamd_handler_failed_deliveries_total.
type Failure uint8

// The reasons of a failed delivery.
const (
	FailureOther       Failure = iota // anything else: a stdout write error, an invalid answer
	FailureUnreachable                // connection refused or reset, DNS failure
	FailureTLS                        // the TLS handshake failed: the server's certificate refused (an unknown authority, expired, another host name), or the peer's alert
	FailureTimeout                    // the handler's timeout passed
	FailureHTTPStatus                 // HTTP 5xx, 408, 429, a wrong url or credentials (401, 403, 404, 405, 407), a batch's 4xx
	FailureExecStart                  // the command could not be started
	FailureExecSignal                 // the command was killed by a signal
	FailureExecStatus                 // the command exited with another status than 0, 65 and 75
	FailureTempFail                   // the command exited 75 (EX_TEMPFAIL)
	FailureCanceled                   // the delivery was cancelled: the daemon stops
	NumFailures
)

var failureNames = [NumFailures]string{
	FailureOther:       "other",
	FailureUnreachable: "unreachable",
	FailureTLS:         "tls",
	FailureTimeout:     "timeout",
	FailureHTTPStatus:  "http_status",
	FailureExecStart:   "exec_start",
	FailureExecSignal:  "exec_signal",
	FailureExecStatus:  "exec_status",
	FailureTempFail:    "tempfail",
	FailureCanceled:    "canceled",
}

// isTLSFailure reports whether err is a failed TLS handshake: the peer's
// certificate refused, an alert from the peer (a client certificate it
// requires, a TLS version it does not speak) or to it, or a peer that
// does not speak TLS (plain HTTP included). A delivery that fails so is
// counted as FailureTLS, not as an unreachable server: what mends it is a
// certificate, a ca_file or the url's scheme, not the network.
func isTLSFailure(err error) bool {
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[tls.AlertError](err); ok {
		return true
	}
	// Over TCP, crypto/tls gives an alert as a *net.OpError whose Err is
	// the alert ("tls: ..."), of a type of its own.
	if op, ok := errors.AsType[*net.OpError](err); ok && (op.Op == "remote error" || op.Op == "local error") &&
		op.Err != nil && strings.HasPrefix(op.Err.Error(), "tls: ") {
		return true
	}
	if errors.Is(err, http.ErrSchemeMismatch) {
		return true
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return true
	}
	_, ok := errors.AsType[x509.CertificateInvalidError](err)
	return ok
}

// String returns the failure's label value.
func (f Failure) String() string {
	if f < NumFailures {
		return failureNames[f]
	}
	return "unknown"
}

// Failed is the OutcomeFailed of a delivery that failed for reason f.
func Failed(f Failure, err error) Outcome {
	return Outcome{Kind: OutcomeFailed, Failure: f, Err: err}
}

// Delivery is one record handed to a handler.
type Delivery struct {
	Subscription string
	Key          string
	Shard        uint64
	Seq          uint64
	TimestampMs  uint64
	// Headers, Payload and Attempt are the record. A handler that
	// declares it does not read them ([Blind]) gets nil, nil and 0.
	//
	// Headers are the record's envelope headers, with stream-sequence set
	// to Seq. The values, and the slice, are valid only until Handle
	// returns: the daemon makes the next delivery in the same memory. A
	// handler that keeps them longer copies them ([envelope.Headers.Clone]).
	// The names are strings, which stay valid.
	Headers envelope.Headers
	// Payload is the record's payload without the envelope. It is valid
	// only until Handle returns; a handler that keeps it longer copies it.
	Payload []byte
	// Attempt is 1 for the first delivery, and one more than the
	// x-ruststream-retry-count header of a copy.
	Attempt uint64
	// File identifies the stream file the record was read from (a hash of
	// its identity), Offset is where the record is in it, and Checksum is
	// the payload's checksum stored in its frame; File is "" in a pipe
	// stage, whose records have no file. See [Delivery.RecordID].
	File     string
	Offset   int64
	Checksum uint16
}

// RecordID identifies d's record for good (see appendRecordID), for a
// handler that makes its own deliveries idempotent; it is "" in a pipe
// stage, whose records have no file.
func (d *Delivery) RecordID() string {
	if d.File == "" {
		return ""
	}
	return string(d.appendRecordID(nil))
}

// appendRecordID appends to b the identity of d's record for good: its
// file's identity, its offset there, its timestamp and its payload's
// checksum in hexadecimal. A record read again after a restart has the
// same one, and a copy of it another. So has a record written at the
// offset of an earlier one, in a file truncated and written again under
// the same header (which keeps the file's identity), unless it has the
// same timestamp and checksum too. d.File must not be "".
func (d *Delivery) appendRecordID(b []byte) []byte {
	b = append(b, d.File...)
	b = append(b, '-')
	b = strconv.AppendInt(b, d.Offset, 10)
	b = append(b, '-')
	b = strconv.AppendUint(b, d.TimestampMs, 10)
	b = append(b, '-')
	return strconv.AppendUint(b, uint64(d.Checksum), 16)
}

// frame is d's record as the streamfile formats write it: its key,
// shard, seq, timestamp and payload.
func (d *Delivery) frame() *streamfile.Frame {
	return &streamfile.Frame{Key: d.Key, Shard: d.Shard, Seq: d.Seq, TimestampMs: d.TimestampMs, Payload: d.Payload}
}

// deliveryMeta is the metadata of a delivery that the exec, http and nats
// handlers pass besides the payload and the record headers, in the order
// they pass it, with the name each gives it: an environment variable, a
// request or message header. value returns the value as text: the subscription's
// name, the stream key, or a number in decimal.
var deliveryMeta = [...]struct {
	env, header string
	value       func(d *Delivery) string
}{
	{"STREAMD_SUBSCRIPTION", subscriptionHeader, func(d *Delivery) string { return d.Subscription }},
	{"STREAMD_STREAM_KEY", "Streamd-Stream-Key", func(d *Delivery) string { return d.Key }},
	{"STREAMD_SEQ", "Streamd-Seq", func(d *Delivery) string { return strconv.FormatUint(d.Seq, 10) }},
	{"STREAMD_SHARD", "Streamd-Shard", func(d *Delivery) string { return strconv.FormatUint(d.Shard, 10) }},
	{"STREAMD_TIMESTAMP_MS", "Streamd-Timestamp-Ms", func(d *Delivery) string { return strconv.FormatUint(d.TimestampMs, 10) }},
	{"STREAMD_ATTEMPT", "Streamd-Attempt", func(d *Delivery) string { return strconv.FormatUint(d.Attempt, 10) }},
}

// subscriptionHeader is the request header, and the NATS message header,
// that names the delivery's subscription; a batch request carries it too.
const subscriptionHeader = "Streamd-Subscription"

// putRecordFields puts d's record headers (see httpRecordHeaderPrefix) and
// its metadata into the header fields h of an HTTP request or a NATS
// message, their values into vs.
func putRecordFields(h map[string][]string, vs *fieldValues, d *Delivery) {
	for _, e := range d.Headers {
		if httpTextValue(e.Value) {
			vs.put(h, recordFieldName(e.Name), string(e.Value))
		} else {
			vs.put(h, httpBase64RecordHeaderPrefix+escapeHeaderName(e.Name), base64Value(e.Value))
		}
	}
	for _, m := range deliveryMeta {
		vs.put(h, m.header, m.value(d))
	}
}

// recordFieldName is the header field that carries the record header
// name with a plain text value. Those that nearly every record carries
// cost no allocation.
func recordFieldName(name string) string {
	switch name {
	case envelope.SequenceHeader:
		return httpRecordHeaderPrefix + envelope.SequenceHeader
	case envelope.RetryCountHeader:
		return httpRecordHeaderPrefix + envelope.RetryCountHeader
	}
	return httpRecordHeaderPrefix + escapeHeaderName(name)
}

// fieldValues holds the values of the header fields of one request or
// message, each field's value a one-element slice of its array: the
// fields cost one allocation in all, where a slice for each would cost one
// each. Its capacity should be the number of fields; past it, put
// allocates a larger array, and the fields put before keep the old one.
type fieldValues []string

// put sets h's field name to value.
func (vs *fieldValues) put(h map[string][]string, name, value string) {
	*vs = append(*vs, value)
	n := len(*vs)
	h[name] = (*vs)[n-1 : n : n]
}

// Handler handles deliveries. Handle may be called from several goroutines
// at once when a subscription's concurrency is above 1. It must return when
// ctx ends; what it returns then is settled like any outcome.
type Handler interface {
	Handle(ctx context.Context, d *Delivery) Outcome
}

// Blind is implemented by a handler that can declare that it decides
// without reading a delivery's record, its Headers, Payload and Attempt,
// only its metadata (Subscription, Key, Shard, Seq, TimestampMs, File and
// Offset), as discard does. Most of what an enveloped record costs to read
// is its envelope (settlement.md §9): the check of its base64 text and the
// decoding of its headers and payload. The daemon hands a blind handler
// deliveries without the record, and does that work only when it needs
// the record itself: for a copy (a retry, a dead letter), and for the
// headers of a record that may be a retry copy of another subscription.
type Blind interface {
	Handler
	// Blind reports whether Handle reads nothing but a delivery's
	// metadata.
	Blind() bool
}

// IsBlind reports whether h decides without reading a delivery's record
// (Headers, Payload, Attempt): whether it is a [Blind] that declares so.
func IsBlind(h Handler) bool {
	b, ok := h.(Blind)
	return ok && b.Blind()
}

// Reconnecting is implemented by a handler that knows when its connection
// to its endpoint is made again after it was lost, as the nats kind does.
// A delivery held after a failure of reason FailureUnreachable or FailureTLS is then
// delivered again at once, instead of at the next backoff step.
type Reconnecting interface {
	Handler
	// Reconnected returns a channel closed the next time the handler's
	// connection is made again. The daemon takes it before each delivery,
	// so that a reconnection during the delivery is not missed.
	Reconnected() <-chan struct{}
}

// BatchHandler is a Handler that also takes several deliveries in one
// call. A subscription whose handler table sets batch_max_records hands it
// batches of the records it reads (see [conf.Handler.BatchMaxRecords]); the
// http and nats kinds are such handlers.
type BatchHandler interface {
	Handler
	// HandleBatch handles ds and sets outs[i] (len(outs) == len(ds)) to
	// the outcome of ds[i]: an answer, settled as Handle's, or
	// OutcomeFailed when the delivery of ds[i] failed (of every one when
	// the whole batch failed; an outcome it leaves as it finds it is
	// such a failure too). Those that failed are delivered again
	// together, in place; those answered are settled at once, while the
	// others are held, and are not delivered again. The deliveries'
	// payloads and headers are valid only until it returns. It may be
	// called from several goroutines at once, and must return when ctx
	// ends.
	HandleBatch(ctx context.Context, ds []Delivery, outs []Outcome)
}

// HandlerFunc adapts a function to a Handler, for programs that embed the
// daemon.
type HandlerFunc func(ctx context.Context, d *Delivery) Outcome

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d *Delivery) Outcome { return f(ctx, d) }

// base64Value is a record header value that is not text as the exec,
// http and nats kinds send it: standard base64 with padding.
func base64Value(v []byte) string { return base64.StdEncoding.EncodeToString(v) }
