package handler

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/streamd/streamd/streamfile"
)

// The http handler's batches: one POST per batch, the records as NDJSON.
const (
	// httpBatchContentType is the Content-Type of a batch's body.
	httpBatchContentType = "application/x-ndjson"
	// httpBatchLineLimit bounds, with httpDrainLimit, the answer to a
	// batch: httpDrainLimit plus this much per record. An answer line
	// needs less than 100 bytes; the rest is room for members of the
	// server's own, such as a reason.
	httpBatchLineLimit = 1024
	// httpBatchLineFields is about what a record's line takes besides
	// its payload and header values: the field names and numbers.
	httpBatchLineFields = 128
)

// HandleBatch POSTs ds in one request, one line of NDJSON per record, and
// maps the response to an outcome per record.
//
// A record's line is its object in the schema of streamd decode --headers
// --format=ndjson ([streamfile.FormatNDJSON] with
// [streamfile.FrameContext.ShowHeaders]), without the offset and the
// checksum, and with the headers a handler gets (stream-sequence is the
// record's seq):
//
//	{"stream_key":"orders","shard_id":0,"seq":7,"timestamp_ms":1700000000500,
//	 "headers":{"stream-sequence":"7"},"payload_b64":"aGVsbG8="}
//
// The request carries the configured headers, Content-Type:
// application/x-ndjson and Streamd-Subscription. The response:
//
//	Streamd-Outcome response header     the outcome of every record (an invalid value: failed)
//	2xx, empty body                     ack, every record
//	2xx, a body                         one outcome per record, see parseBatchAnswer
//	                                    (a body that is not such an answer: failed)
//	429 or 503                          failed, held for its Retry-After as a single record is
//	any other status                    failed: a batch is never dropped by its status
//	timeout, transport error            failed
//	ctx ended (shutdown)                failed (cancelled)
func (h *httpHandler) HandleBatch(ctx context.Context, ds []Delivery, outs []Outcome) {
	header := h.newHeader(2)
	header["Content-Type"] = []string{httpBatchContentType}
	header[subscriptionHeader] = []string{ds[0].Subscription}
	body := batchBody(ds)
	resp, o := h.send(ctx, body, header)
	if resp == nil {
		fill(outs, o)
		return
	}
	defer release(resp)
	_, named := resp.Header[httpOutcomeHeader]
	if code := resp.StatusCode; !named && dropsByStatus(code) { // the others fail as for a single record
		fill(outs, Failed(FailureHTTPStatus, statusError(resp, batchRefusal(code, len(body), len(ds)))))
		return
	}
	if named || resp.StatusCode < 200 || resp.StatusCode > 299 {
		fill(outs, h.outcome(resp))
		return
	}
	limit := httpDrainLimit + len(ds)*httpBatchLineLimit
	answer, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	switch {
	case err != nil:
		fill(outs, h.transportFailure(ctx, err))
	case len(answer) > limit:
		fill(outs, Failed(FailureOther, fmt.Errorf("http: the answer to a batch of %d records is longer than %d bytes", len(ds), limit)))
	default:
		if err := parseBatchAnswer(answer, ds, outs); err != nil {
			fill(outs, Failed(FailureOther, fmt.Errorf("http: %s, answer to a batch of %d records: %w", resp.Status, len(ds), err)))
		}
	}
}

// batchRefusal explains a 4xx answer that would drop a single record
// (dropsByStatus) to a batch of records in a body of size bytes, which
// holds it: what to check for a 413, and what a server should answer
// instead.
func batchRefusal(code, size, records int) string {
	switch {
	case code == http.StatusRequestEntityTooLarge && records == 1:
		// A record past batch_max_bytes goes alone: no bound of a batch
		// makes it smaller.
		return fmt.Sprintf("the server takes no body of %d bytes, a batch of this one record: raise the server's limit, or set max_failed_deliveries to give up on such a record", size)
	case code == http.StatusRequestEntityTooLarge:
		return fmt.Sprintf("the server takes no body of %d bytes (a batch of %d records): lower batch_max_bytes or batch_max_records, or raise the server's limit", size, records)
	}
	return "a batch is not dropped by its status: a server that refuses some records answers drop for each"
}

// batchBody is the request body of the batch ds: one line per record.
func batchBody(ds []Delivery) []byte {
	n := 0
	for i := range ds {
		n += base64.StdEncoding.EncodedLen(len(ds[i].Payload)) + httpBatchLineFields
		for _, e := range ds[i].Headers {
			n += len(e.Name) + base64.StdEncoding.EncodedLen(len(e.Value)) + 8
		}
	}
	b := make([]byte, 0, n)
	for i := range ds {
		d := &ds[i]
		b = streamfile.FormatNDJSON.AppendFrame(b, d.frame(), &streamfile.FrameContext{ShowHeaders: true, Headers: d.Headers})
	}
	return b
}

// fill sets every outcome of outs to o.
func fill(outs []Outcome, o Outcome) {
	for i := range outs {
		outs[i] = o
	}
}

// batchAnswerLine is one line of the answer to a batch.
type batchAnswerLine struct {
	Outcome *string `json:"outcome"`
	Seq     *uint64 `json:"seq"`
}

// parseBatchAnswer reads the body of a 2xx answer to the batch ds into
// outs, one outcome per record. A body of JSON white space alone (none, or
// blank lines, which frameworks add) acknowledges every record.
// Otherwise the body has exactly one line per record, in the batch's order,
// each ended by a newline (the last one's is optional), and after the last
// one only blank lines; a blank line before or between record lines is an
// error, as the record it answers is unclear. A record's line is a JSON
// object whose "outcome" member is a string that Streamd-Outcome could
// hold, "ack", "drop", "retry" or "retry_after=<duration>" (see
// parseOutcomeDirective), and whose optional "seq" member, when there, is
// the record's seq (a check that the answer lines up with the batch).
// Other members are ignored. Anything else is an error, and outs is then
// left partly set.
//
//	{"outcome":"ack"}
//	{"seq":8,"outcome":"retry_after=30s"}
//	{"outcome":"drop","why":"not an order"}
func parseBatchAnswer(body []byte, ds []Delivery, outs []Outcome) error {
	body = bytes.TrimRight(body, " \t\r\n") // the blank lines after the last record's
	if len(body) == 0 {
		fill(outs, Outcome{Kind: OutcomeAck})
		return nil
	}
	if lines := bytes.Count(body, []byte("\n")) + 1; lines != len(ds) {
		unit := "lines"
		if lines == 1 {
			unit = "line"
		}
		return fmt.Errorf("%d %s for %d records: answer one line per record, or nothing to acknowledge them all", lines, unit, len(ds))
	}
	for i := range ds {
		line, rest, _ := bytes.Cut(body, []byte("\n"))
		body = rest
		var a batchAnswerLine
		if err := json.Unmarshal(line, &a); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field == "" {
				err = errors.New("not a JSON object")
			}
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		if a.Outcome == nil {
			return fmt.Errorf(`line %d: no "outcome" member`, i+1)
		}
		if a.Seq != nil && *a.Seq != ds[i].Seq {
			return fmt.Errorf("line %d answers seq %d, but record %d of the batch has seq %d", i+1, *a.Seq, i+1, ds[i].Seq)
		}
		o, err := parseOutcomeDirective(*a.Outcome)
		if err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		outs[i] = o
	}
	return nil
}
