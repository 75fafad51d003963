package handler

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
)

// stdoutDeliveries are the records of the golden outputs below.
func stdoutDeliveries() []*Delivery {
	return []*Delivery{
		testDelivery(),
		{
			Subscription: "audit",
			Key:          "events.v2",
			Shard:        18446744073709551615,
			Seq:          9007199254740993,
			TimestampMs:  1700000000000,
			Attempt:      1,
			Headers:      envelope.Headers{{Name: "note", Value: []byte("say \"hi\"\n<b>é\\")}},
			Payload:      []byte{0xff, 0xfe, 0x00},
		},
		{Subscription: "audit", Key: "events.v2", Seq: 1, TimestampMs: 1700000000123, Attempt: 3},
	}
}

func TestStdoutHandlerGolden(t *testing.T) {
	tests := []struct {
		format string
		want   string
	}{
		{format: "", want: "" +
			"[2023-11-14T22:13:20.5 | orders | 7 | 3] hello\n" +
			"[2023-11-14T22:13:20.0 | events.v2 | 9007199254740993 | 18446744073709551615] <BINARY BLOB>\n" +
			"[2023-11-14T22:13:20.123 | events.v2 | 1 | 0] \n"},
		{format: "log", want: "" +
			"[2023-11-14T22:13:20.5 | orders | 7 | 3] hello\n" +
			"[2023-11-14T22:13:20.0 | events.v2 | 9007199254740993 | 18446744073709551615] <BINARY BLOB>\n" +
			"[2023-11-14T22:13:20.123 | events.v2 | 1 | 0] \n"},
		{format: "ndjson", want: "" +
			`{"subscription":"billing","stream_key":"orders","shard_id":3,"seq":7,"timestamp_ms":1700000000500,"attempt":2,` +
			`"headers":{"content-type":"text/plain","x-tenant":"acme","we ird%name":" padded","empty":"","stream-sequence":"7"},` +
			`"headers_b64":{"bin":"AP8="},"payload_b64":"aGVsbG8="}` + "\n" +
			`{"subscription":"audit","stream_key":"events.v2","shard_id":18446744073709551615,"seq":9007199254740993,"timestamp_ms":1700000000000,"attempt":1,` +
			`"headers":{"note":"say \"hi\"\n<b>é\\"},"payload_b64":"//4A"}` + "\n" +
			`{"subscription":"audit","stream_key":"events.v2","shard_id":0,"seq":1,"timestamp_ms":1700000000123,"attempt":3,` +
			`"headers":{},"payload_b64":""}` + "\n"},
	}
	for _, tt := range tests {
		t.Run("format="+tt.format, func(t *testing.T) {
			var out bytes.Buffer
			h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerStdout, Format: tt.format}, &out, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range stdoutDeliveries() {
				checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
			}
			if got := out.String(); got != tt.want {
				t.Errorf("output:\n%s\nwant:\n%s", got, tt.want)
			}
			if tt.format == "ndjson" {
				for line := range strings.Lines(out.String()) {
					if !json.Valid([]byte(line)) {
						t.Errorf("not JSON: %s", line)
					}
				}
			}
		})
	}
}

func TestStdoutHandlerConcurrent(t *testing.T) {
	const goroutines, records = 8, 100
	for _, format := range []string{"log", "ndjson"} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer // not safe for concurrent use: the handler serialises writes
			h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerStdout, Format: format}, &out, nil)
			if err != nil {
				t.Fatal(err)
			}
			var one bytes.Buffer
			single, err := New(t.Context(), conf.Handler{Kind: conf.HandlerStdout, Format: format}, &one, nil)
			if err != nil {
				t.Fatal(err)
			}
			single.Handle(t.Context(), testDelivery())
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for range records {
						h.Handle(t.Context(), testDelivery())
					}
				})
			}
			wg.Wait()
			if want := strings.Repeat(one.String(), goroutines*records); out.String() != want {
				t.Errorf("%d concurrent records: lines are torn or missing", goroutines*records)
			}
		})
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestStdoutHandlerWriteError(t *testing.T) {
	h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerStdout}, failingWriter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeFailed, 0, 0, "stdout: disk full")
}

func TestDiscardHandler(t *testing.T) {
	h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerDiscard}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, d := t.Context(), testDelivery()
	checkOutcome(t, h.Handle(ctx, d), OutcomeAck, 0, 0, "")
	if allocs := testing.AllocsPerRun(1000, func() { h.Handle(ctx, d) }); allocs != 0 {
		t.Errorf("Handle allocates %v times per record, want 0", allocs)
	}
}

func TestNewHandlerErrors(t *testing.T) {
	tests := []struct {
		name   string
		cfg    conf.Handler
		stdout io.Writer
		err    string
	}{
		{name: "unknown kind", cfg: conf.Handler{Kind: "kafka"}, stdout: io.Discard,
			err: `unknown handler kind "kafka": use http, exec, stdout, discard or nats`},
		{name: "unknown stdout format", cfg: conf.Handler{Kind: conf.HandlerStdout, Format: "xml"}, stdout: io.Discard,
			err: `stdout handler: unknown format "xml": use log or ndjson`},
		{name: "stdout without a writer", cfg: conf.Handler{Kind: conf.HandlerStdout},
			err: "stdout handler: no output writer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(t.Context(), tt.cfg, tt.stdout, nil)
			if err == nil || err.Error() != tt.err {
				t.Errorf("New: %v, want %q", err, tt.err)
			}
		})
	}
}
