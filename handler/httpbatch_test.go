package handler

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/streamfile"
)

// testBatch is three deliveries with seqs 7, 8 and 9, the first with the
// headers of testDelivery.
func testBatch() []Delivery {
	ds := []Delivery{*testDelivery(), *testDelivery(), *testDelivery()}
	for i := range ds[1:] {
		d := &ds[i+1]
		d.Seq, d.Payload = uint64(8+i), []byte{'p', byte('0' + i), '\n', 0xff}
		d.Headers = envelope.Headers{{Name: envelope.SequenceHeader, Value: []byte{byte('8' + i)}}}
	}
	return ds
}

// batchServer is a server that records each batch's request and answers
// with answer.
func batchServer(t *testing.T, answer http.HandlerFunc) (url string, requests <-chan *http.Request, bodies <-chan []byte) {
	t.Helper()
	reqs, bs := make(chan *http.Request, 10), make(chan []byte, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		reqs <- r
		bs <- b
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, reqs, bs
}

// TestHTTPBatchRequest: a batch is one POST of NDJSON, each line the
// record as streamd decode --headers --format=ndjson prints it (without
// offset and checksum), with the configured headers.
func TestHTTPBatchRequest(t *testing.T) {
	url, reqs, bodies := batchServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: url, BatchMaxRecords: 10,
		Headers: map[string]string{"X-Tenant": "acme", "Content-Type": "text/plain", "Host": "orders.example"}}).(BatchHandler)
	ds := testBatch()
	outs := make([]Outcome, len(ds))
	h.HandleBatch(context.Background(), ds, outs)
	for _, o := range outs {
		checkOutcome(t, o, OutcomeAck, 0, 0, "")
	}
	r, body := <-reqs, <-bodies
	for name, want := range map[string]string{
		"Content-Type": "application/x-ndjson", "X-Tenant": "acme", "Streamd-Subscription": "billing",
		"User-Agent": "streamd", "Streamd-Seq": "",
	} {
		if got := r.Header.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if r.Method != http.MethodPost || r.Host != "orders.example" || r.ContentLength != int64(len(body)) {
		t.Errorf("%s, Host %q, Content-Length %d for %d bytes", r.Method, r.Host, r.ContentLength, len(body))
	}
	// decode --headers prints each record with its offset and checksum,
	// which a batch leaves out.
	var want []byte
	for i := range ds {
		d := &ds[i]
		want = streamfile.FormatNDJSON.WithHeaders().AppendRecord(want, &streamfile.Record{Offset: 128, Frame: streamfile.Frame{
			Key: d.Key, Shard: d.Shard, Seq: d.Seq, TimestampMs: d.TimestampMs, Payload: envelope.Encode(d.Headers, d.Payload, false)}})
	}
	if got, want := ndjsonWithout(t, body), ndjsonWithout(t, want, "offset", "checksum"); got != want {
		t.Errorf("body\n%s\nwant the records as decode --headers prints them\n%s", got, want)
	}
}

// ndjsonWithout returns the lines of b, each a JSON object, without the
// members named, written again with their members in order of name.
func ndjsonWithout(t *testing.T, b []byte, names ...string) string {
	t.Helper()
	var out strings.Builder
	for line := range strings.Lines(string(b)) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		for _, name := range names {
			delete(m, name)
		}
		j, _ := json.Marshal(m)
		out.Write(append(j, '\n'))
	}
	return out.String()
}

// TestHTTPBatchOutcomes: what each answer to a batch of three records
// (seqs 7, 8, 9) makes of each record.
func TestHTTPBatchOutcomes(t *testing.T) {
	type want struct {
		kind  OutcomeKind
		delay time.Duration
	}
	ack, drop, retry := want{kind: OutcomeAck}, want{kind: OutcomeDrop}, want{kind: OutcomeRetry}
	failed := want{kind: OutcomeFailed}
	answer := func(code int, body string, header ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i+1 < len(header); i += 2 {
				w.Header().Set(header[i], header[i+1])
			}
			w.WriteHeader(code)
			io.WriteString(w, body)
		}
	}
	tests := []struct {
		name   string
		server http.HandlerFunc
		want   []want
		err    string // in every failed outcome
	}{
		{"204", answer(204, ""), []want{ack, ack, ack}, ""},
		{"200 empty", answer(200, ""), []want{ack, ack, ack}, ""},
		{"200 each ack", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n"), []want{ack, ack, ack}, ""},
		{"200 each drop", answer(200, "{\"outcome\":\"drop\"}\n{\"outcome\":\"drop\"}\n{\"outcome\":\"drop\"}"), []want{drop, drop, drop}, ""},
		{"200 each retry", answer(200, "{\"outcome\":\"retry\"}\r\n{\"outcome\":\"retry\"}\r\n{\"outcome\":\"retry\"}\r\n"), []want{retry, retry, retry}, ""},
		{"200 each retry_after", answer(200, "{\"outcome\":\"retry_after=5s\"}\n{\"outcome\":\"retry_after=0s\"}\n{\"outcome\":\"retry_after=1m\"}\n"),
			[]want{{OutcomeRetryAfter, 5 * time.Second}, {OutcomeRetryAfter, 0}, {OutcomeRetryAfter, time.Minute}}, ""},
		{"202 mixed, with seqs and other members", answer(202, "{\"seq\":7,\"outcome\":\"drop\",\"why\":\"bad\"}\n {\"outcome\" : \"ack\"} \n{\"seq\":9,\"outcome\":\"retry_after=250ms\"}\n"),
			[]want{drop, ack, {OutcomeRetryAfter, 250 * time.Millisecond}}, ""},
		{"Streamd-Outcome for all", answer(200, "ignored", "Streamd-Outcome", "retry_after=2s"),
			[]want{{OutcomeRetryAfter, 2 * time.Second}, {OutcomeRetryAfter, 2 * time.Second}, {OutcomeRetryAfter, 2 * time.Second}}, ""},
		{"Streamd-Outcome invalid", answer(200, "", "Streamd-Outcome", "later"), []want{failed, failed, failed}, "invalid outcome"},
		{"503", answer(503, "busy"), []want{failed, failed, failed}, "http: 503 Service Unavailable: \"busy\""},
		{"503 Retry-After", answer(503, "", "Retry-After", "4"),
			[]want{{OutcomeFailed, 4 * time.Second}, {OutcomeFailed, 4 * time.Second}, {OutcomeFailed, 4 * time.Second}}, "503"},
		{"429 Retry-After", answer(429, "", "Retry-After", "1"),
			[]want{{OutcomeFailed, time.Second}, {OutcomeFailed, time.Second}, {OutcomeFailed, time.Second}}, "429"},
		{"408", answer(408, ""), []want{failed, failed, failed}, "408"},
		{"400 is no drop of the batch", answer(400, "no"), []want{failed, failed, failed}, "a batch is not dropped by its status"},
		{"401 names bearer_token_file", answer(401, ""), []want{failed, failed, failed}, "401 Unauthorized, the server refuses the credentials: check bearer_token_file"},
		{"403 names bearer_token_file", answer(403, ""), []want{failed, failed, failed}, "403 Forbidden, the server refuses the credentials: check bearer_token_file"},
		{"404 names the url", answer(404, ""), []want{failed, failed, failed}, "404 Not Found, check the url"},
		{"404 shows the body", answer(404, "no such route /ingest"), []want{failed, failed, failed}, `: "no such route /ingest"`},
		{"405 names the url", answer(405, ""), []want{failed, failed, failed}, "405 Method Not Allowed, check the url"},
		{"407 names the proxy", answer(407, ""), []want{failed, failed, failed}, "407 Proxy Authentication Required, the proxy refuses the credentials"},
		{"404 with Streamd-Outcome", answer(404, "", "Streamd-Outcome", "ack"), []want{ack, ack, ack}, ""},
		{"413", answer(413, ""), []want{failed, failed, failed}, "413 Request Entity Too Large, the server takes no body of "},
		{"413 says lower batch_max_bytes", answer(413, ""), []want{failed, failed, failed}, "bytes (a batch of 3 records): lower batch_max_bytes or batch_max_records"},
		{"413 with Streamd-Outcome", answer(413, "", "Streamd-Outcome", "drop"), []want{drop, drop, drop}, ""},
		{"500", answer(500, ""), []want{failed, failed, failed}, "500"},
		{"short", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n"), []want{failed, failed, failed}, "2 lines for 3 records"},
		{"long", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n"), []want{failed, failed, failed}, "4 lines for 3 records"},
		{"blank line", answer(200, "{\"outcome\":\"ack\"}\n\n{\"outcome\":\"ack\"}\n"), []want{failed, failed, failed}, "line 2"},
		{"blank lines after the last", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n{\"outcome\":\"drop\"}\n\n\n"), []want{ack, ack, drop}, ""},
		{"CRLF blank lines after the last", answer(200, "{\"outcome\":\"ack\"}\r\n{\"outcome\":\"retry\"}\r\n{\"outcome\":\"ack\"}\r\n\r\n"), []want{ack, retry, ack}, ""},
		{"white space lines after the last", answer(200, "{\"outcome\":\"drop\"}\n{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n \t\n\r\n  "), []want{drop, ack, ack}, ""},
		{"blank line between, and after the last", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n\n{\"outcome\":\"ack\"}\n\n"), []want{failed, failed, failed}, "4 lines for 3 records"},
		{"short, then blank lines", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n\n\n"), []want{failed, failed, failed}, "2 lines for 3 records"},
		{"seq out of line", answer(200, "{\"seq\":8,\"outcome\":\"ack\"}\n{\"seq\":7,\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n"),
			[]want{failed, failed, failed}, "line 1 answers seq 8, but record 1 of the batch has seq 7"},
		{"bad outcome", answer(200, "{\"outcome\":\"ack\"}\n{\"outcome\":\"nack\"}\n{\"outcome\":\"ack\"}\n"), []want{failed, failed, failed}, `line 2: invalid outcome "nack"`},
		{"plain words", answer(200, "ack\nack\nack\n"), []want{failed, failed, failed}, "line 1: invalid character"},
		{"a JSON string", answer(200, "\"ack\"\n\"ack\"\n\"ack\"\n"), []want{failed, failed, failed}, "line 1: not a JSON object"},
		{"no outcome", answer(200, "{}\n{}\n{}\n"), []want{failed, failed, failed}, `line 1: no "outcome" member`},
		{"OK", answer(200, "OK"), []want{failed, failed, failed}, "1 line for 3 records"},
		{"a newline alone", answer(200, "\n"), []want{ack, ack, ack}, ""},
		{"white space alone", answer(200, " \r\n"), []want{ack, ack, ack}, ""},
		{"blank lines alone", answer(200, "\n\n\n"), []want{ack, ack, ack}, ""},
		{"CRLF blank lines alone", answer(200, "\r\n \r\n\t\r\n"), []want{ack, ack, ack}, ""},
		{"a blank line first", answer(200, "\n{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n{\"outcome\":\"ack\"}\n"), []want{failed, failed, failed}, "4 lines for 3 records"},
		{"too long", answer(200, strings.Repeat(" ", httpDrainLimit+3*httpBatchLineLimit+1)), []want{failed, failed, failed}, "longer than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url, _, _ := batchServer(t, tc.server)
			h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: url, BatchMaxRecords: 3}).(BatchHandler)
			outs := make([]Outcome, 3)
			h.HandleBatch(context.Background(), testBatch(), outs)
			for i, o := range outs {
				err := ""
				if tc.want[i].kind == OutcomeFailed {
					err = tc.err
				}
				t.Run(string(rune('a'+i)), func(t *testing.T) { checkOutcome(t, o, tc.want[i].kind, tc.want[i].delay, tc.want[i].delay, err) })
			}
		})
	}
}

// TestHTTPBatchTooLargeAlone: a 413 for a batch of one record, which no
// bound of a batch makes smaller, says what can be done.
func TestHTTPBatchTooLargeAlone(t *testing.T) {
	url, _, _ := batchServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusRequestEntityTooLarge) })
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: url, BatchMaxRecords: 3}).(BatchHandler)
	outs := make([]Outcome, 1)
	h.HandleBatch(context.Background(), testBatch()[:1], outs)
	checkOutcome(t, outs[0], OutcomeFailed, 0, 0, "a batch of this one record: raise the server's limit, or set max_failed_deliveries")
}

// TestHTTPBatchTransport: a batch that gets no answer fails whole.
func TestHTTPBatchTransport(t *testing.T) {
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	tests := []struct {
		name    string
		url     string
		timeout time.Duration
		cancel  bool
		failure Failure
	}{
		{"refused", closed.URL, time.Second, false, FailureUnreachable},
		{"timeout", slow.URL, 50 * time.Millisecond, false, FailureTimeout},
		{"cancelled", slow.URL, 10 * time.Second, true, FailureCanceled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerHTTP, URL: tc.url, BatchMaxRecords: 3, Timeout: conf.Duration(tc.timeout)}).(BatchHandler)
			ctx, cancel := context.WithCancel(context.Background())
			if tc.cancel {
				time.AfterFunc(50*time.Millisecond, cancel)
			}
			defer cancel()
			outs := make([]Outcome, 3)
			h.HandleBatch(ctx, testBatch(), outs)
			for i, o := range outs {
				if o.Kind != OutcomeFailed || o.Failure != tc.failure {
					t.Errorf("record %d: %v %v (%v), want failed %v", i, o.Kind, o.Failure, o.Err, tc.failure)
				}
			}
		})
	}
}

// FuzzParseBatchAnswer: whatever the body, the parser returns an error or
// sets exactly the batch's outcomes from answers it accepts; a blank body
// acks every record; an accepted answer has one line per record, then blank
// lines only, and parses again the same when written back line by line.
func FuzzParseBatchAnswer(f *testing.F) {
	for _, s := range []string{
		"", "{\"outcome\":\"ack\"}\n", "{\"outcome\":\"ack\"}\n{\"outcome\":\"drop\"}\n",
		"{\"seq\":1,\"outcome\":\"retry\"}\n{\"seq\":2,\"outcome\":\"retry_after=5s\"}",
		"{\"outcome\":\"retry_after=-1s\"}", "ack\n", "null\n", "{\"outcome\":1}\n", "{\"outcome\":\"ack\"}\r\n{}\n",
		"{\"outcome\":\"ack\"}\n{\"outcome\":\"drop\"}\n\n", "{\"outcome\":\"ack\"}\r\n{\"outcome\":\"ack\"}\r\n \r\n",
		"{\"outcome\":\"ack\"}\n\n{\"outcome\":\"ack\"}\n",
	} {
		f.Add([]byte(s), uint8(2))
	}
	f.Fuzz(func(t *testing.T, body []byte, n uint8) {
		ds := make([]Delivery, int(n%8)+1)
		for i := range ds {
			ds[i].Seq = uint64(i + 1)
		}
		outs := make([]Outcome, len(ds))
		for i := range outs {
			outs[i] = Outcome{Kind: 99}
		}
		if err := parseBatchAnswer(body, ds, outs); err != nil {
			return
		}
		if len(bytes.Trim(body, " \t\r\n")) == 0 {
			for i, o := range outs {
				if o.Kind != OutcomeAck {
					t.Fatalf("blank body: record %d is %v", i, o.Kind)
				}
			}
			return
		}
		lines := strings.Split(string(body), "\n")
		if len(lines) < len(ds) {
			t.Fatalf("accepted %d lines for %d records", len(lines), len(ds))
		}
		for i, line := range lines {
			if blank := strings.Trim(line, " \t\r") == ""; blank != (i >= len(ds)) {
				t.Fatalf("accepted line %d %q (blank: %v) for %d records", i+1, line, blank, len(ds))
			}
		}
		var again []byte
		for i, o := range outs {
			if o.Kind > OutcomeRetryAfter || o.Delay < 0 || o.Kind != OutcomeRetryAfter && o.Delay != 0 {
				t.Fatalf("record %d: outcome %+v", i, o)
			}
			directive := o.Kind.String()
			if o.Kind == OutcomeRetryAfter {
				directive += "=" + o.Delay.String()
			}
			line, _ := json.Marshal(map[string]any{"seq": ds[i].Seq, "outcome": directive})
			again = append(append(again, line...), '\n')
		}
		outs2 := make([]Outcome, len(ds))
		if err := parseBatchAnswer(again, ds, outs2); err != nil {
			t.Fatalf("the answer written back: %v\n%s", err, again)
		}
		for i := range outs {
			if outs[i] != outs2[i] {
				t.Fatalf("record %d: %+v, written back %+v", i, outs[i], outs2[i])
			}
		}
	})
}
