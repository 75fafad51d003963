package handler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/internal/natstest"
)

// natsConfig is the configuration of a nats handler publishing to
// orders.<key> on srv.
func natsConfig(srv *natstest.Server) conf.Handler {
	return conf.Handler{Kind: conf.HandlerNATS, URL: srv.URL(), Subject: "orders.eu", Timeout: conf.Duration(2 * time.Second)}
}

func TestNATSHandlerNoStream(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
	_, err := New(natsConfig(srv), nil, nil)
	if err == nil || !strings.Contains(err.Error(), `subject "orders.eu": no JetStream stream captures it`) {
		t.Fatalf("New: %v, want the subject named", err)
	}
	cfg := &conf.Config{Subscriptions: []conf.Subscription{{Name: "billing", Key: "eu", Handler: natsConfig(srv)}}}
	if err := Check(cfg); err == nil || !strings.Contains(err.Error(), `subscription "billing": nats handler: subject "orders.eu"`) {
		t.Fatalf("Check: %v, want the subscription and subject named", err)
	}
	cfgKey := natsConfig(srv)
	cfgKey.Subject = "orders.{key}"
	if _, err := New(cfgKey, nil, nil); err == nil || !strings.Contains(err.Error(), "{key}") {
		t.Fatalf("New with {key}: %v, want it refused", err)
	}
}

func TestNATSHandlerPublish(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, MaxMsgSize: 1024})
	h := mustNewHandler(t, natsConfig(srv))

	d := testDelivery()
	d.File, d.Offset = "abc", 4096
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
	o := h.Handle(t.Context(), d)
	checkOutcome(t, o, OutcomeAck, 0, 0, "")
	if !o.Duplicate {
		t.Error("the second publish of one RecordID is not marked Duplicate")
	}
	d.File = ""
	if o := h.Handle(t.Context(), d); o.Kind != OutcomeAck || o.Duplicate {
		t.Errorf("without a RecordID: %+v, want a plain ack", o)
	}
	big := testDelivery()
	big.File, big.Offset, big.Payload = "abc", 8192, make([]byte, 2048)
	checkOutcome(t, h.Handle(t.Context(), big), OutcomeDrop, 0, 0, "")

	msgs := srv.Messages("ORDERS")
	if len(msgs) != 2 {
		t.Fatalf("the stream holds %d messages, want 2", len(msgs))
	}
	m := msgs[0]
	want := map[string]string{
		"Streamd-Header-content-type":           "text/plain",
		"Streamd-Header-x-tenant":               "acme",
		"Streamd-Base64-Header-bin":             "AP8=",
		"Streamd-Base64-Header-we%20ird%25name": "IHBhZGRlZA==",
		"Streamd-Header-empty":                  "",
		"Streamd-Header-stream-sequence":        "7",
		"Streamd-Subscription":                  "billing",
		"Streamd-Stream-Key":                    "orders",
		"Streamd-Seq":                           "7",
		"Streamd-Shard":                         "3",
		"Streamd-Timestamp-Ms":                  "1700000000500",
		"Streamd-Attempt":                       "2",
		"Nats-Msg-Id":                           "abc-4096",
	}
	if m.Subject() != "orders.eu" || string(m.Data()) != "hello" {
		t.Errorf("message %q %q, want orders.eu hello", m.Subject(), m.Data())
	}
	for name, value := range want {
		if got, ok := m.Headers()[name]; !ok || len(got) != 1 || got[0] != value {
			t.Errorf("header %s = %q, want %q", name, got, value)
		}
	}
	if len(m.Headers()) != len(want) {
		t.Errorf("%d headers, want %d: %v", len(m.Headers()), len(want), m.Headers())
	}
	if _, ok := msgs[1].Headers()["Nats-Msg-Id"]; ok {
		t.Error("a delivery without a RecordID carries Nats-Msg-Id")
	}
}

func TestNATSHandlerFailures(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew})
	cfg := natsConfig(srv)
	cfg.Timeout = conf.Duration(300 * time.Millisecond)
	h := mustNewHandler(t, cfg)
	d := testDelivery()
	d.File, d.Offset = "a", 1
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
	d.File, d.Offset = "a", 2
	if o := h.Handle(t.Context(), d); o.Kind != OutcomeFailed || o.Failure != FailureOther || !strings.Contains(o.Err.Error(), "refused") {
		t.Errorf("past the stream's limits: %+v, want failed (other), refused", o)
	}

	srv.Stop()
	if o := h.Handle(t.Context(), d); o.Kind != OutcomeFailed || o.Failure != FailureTimeout && o.Failure != FailureUnreachable {
		t.Errorf("server stopped: %+v, want failed (timeout or unreachable)", o)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if o := h.Handle(ctx, d); o.Kind != OutcomeFailed || o.Failure != FailureCanceled || !errors.Is(o.Err, context.Canceled) {
		t.Errorf("cancelled: %+v, want failed (canceled)", o)
	}
}
