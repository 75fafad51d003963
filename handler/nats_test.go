package handler

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/testutil"
)

// natsConfig is the configuration of a nats handler publishing to
// orders.<key> on srv.
func natsConfig(srv *natstest.Server) conf.Handler {
	return conf.Handler{Kind: conf.HandlerNATS, URL: srv.URL(), Subject: "orders.eu", Timeout: conf.Duration(2 * time.Second)}
}

func TestNATSHandlerNoStream(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
	// A start holds the deliveries instead, as without servers.
	h, err := New(t.Context(), natsConfig(srv), nil, nil)
	if err != nil {
		t.Fatalf("New: %v, want a handler whose deliveries fail", err)
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeFailed, 0, 0, `no JetStream stream answered on subject "orders.eu"`)
	Close(h)
	cfg := &conf.Config{Subscriptions: []conf.Subscription{{Name: "billing", Key: "eu", Handler: natsConfig(srv)}}}
	if err := Check(cfg); err == nil || !strings.Contains(err.Error(), `subscription "billing": nats handler: subject "orders.eu"`) {
		t.Fatalf("Check: %v, want the subscription and subject named", err)
	}
	cfgKey := natsConfig(srv)
	cfgKey.Subject = "orders.{key}"
	if _, err := New(t.Context(), cfgKey, nil, nil); err == nil || !strings.Contains(err.Error(), "{key}") {
		t.Fatalf("New with {key}: %v, want it refused", err)
	}
}

func TestNATSHandlerPublish(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, MaxMsgSize: 1024})
	h := mustNewHandler(t, natsConfig(srv))

	d := testDelivery()
	d.File, d.Offset, d.Checksum = "abc", 4096, 0xbeef
	if id := d.RecordID(); id != "abc-4096-1700000000500-beef" {
		t.Errorf("RecordID = %q, want the file, offset, timestamp and checksum", id)
	}
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
	o := h.Handle(t.Context(), d)
	checkOutcome(t, o, OutcomeAck, 0, 0, "")
	if !o.Duplicate {
		t.Error("the second publish of one record is not marked Duplicate")
	}
	// Another record at the same place of a file with the same identity
	// (truncated and written again under the same header).
	for _, other := range []func(*Delivery){
		func(d *Delivery) { d.TimestampMs++ },
		func(d *Delivery) { d.Checksum++ },
	} {
		o := *d
		other(&o)
		if o := h.Handle(t.Context(), &o); o.Kind != OutcomeAck || o.Duplicate {
			t.Errorf("another record at the same offset: %+v, want a plain ack", o)
		}
	}
	if d.File = ""; d.RecordID() != "" {
		t.Errorf("RecordID without a file = %q, want none", d.RecordID())
	}
	if o := h.Handle(t.Context(), d); o.Kind != OutcomeAck || o.Duplicate {
		t.Errorf("without a file: %+v, want a plain ack", o)
	}
	big := testDelivery()
	big.File, big.Offset, big.Payload = "abc", 8192, make([]byte, 2048)
	var logs testutil.SyncBuffer
	logged, err := New(t.Context(), natsConfig(srv), nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer Close(logged)
	checkOutcome(t, logged.Handle(t.Context(), big), OutcomeDrop, 0, 0, "")
	// The size the limits count: the payload and the headers.
	if line := logs.String(); !strings.Contains(line, "dropping a record too large") || !strings.Contains(line, "payload_bytes=2048") || strings.Contains(line, " bytes=2048") {
		t.Errorf("the drop's log line %q does not give the message's size beside the payload's", line)
	}

	msgs := srv.Messages("ORDERS")
	if len(msgs) != 4 {
		t.Fatalf("the stream holds %d messages, want 4", len(msgs))
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
		"Nats-Msg-Id":                           "billing:abc-4096-1700000000500-beef",
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
	if _, ok := msgs[3].Headers()["Nats-Msg-Id"]; ok {
		t.Error("a delivery without a file carries Nats-Msg-Id")
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
	nc := h.(*natsHandler).conn.Load().nc
	for nc.IsConnected() {
		runtime.Gosched() // until the client notices the server is gone
	}
	if o := h.Handle(t.Context(), d); o.Failure != FailureUnreachable || o.Err.Error() != "nats: not connected to any NATS server; reconnecting" {
		t.Errorf("disconnected: %+v, want failed (unreachable), not connected", o)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if o := h.Handle(ctx, d); o.Kind != OutcomeFailed || o.Failure != FailureCanceled || !errors.Is(o.Err, context.Canceled) {
		t.Errorf("cancelled: %+v, want failed (canceled)", o)
	}
}

// TestNATSHandlerBatch: a batch's records are published in order, each
// settled as Handle settles it alone (an ack, a duplicate ack, a drop, a
// refusal), and a batch that cannot reach JetStream fails whole.
func TestNATSHandlerBatch(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, MaxMsgSize: 1024, MaxMsgs: 4, Discard: jetstream.DiscardNew})
	cfg := natsConfig(srv)
	cfg.Timeout = conf.Duration(300 * time.Millisecond)
	h := mustNewHandler(t, cfg).(BatchHandler)

	record := func(offset int64, payload string) Delivery {
		d := testDelivery()
		d.File, d.Offset, d.Payload = "abc", offset, []byte(payload)
		return *d
	}
	checkOutcome(t, h.Handle(t.Context(), new(record(1, "first"))), OutcomeAck, 0, 0, "")
	noID := record(0, "no id")
	noID.File = ""
	ds := []Delivery{
		record(2, "second"),
		record(1, "first, again"),            // the id of the first: a duplicate
		record(3, strings.Repeat("x", 2048)), // larger than max_msg_size
		noID,
		record(4, "fourth"),
		record(5, "past max_msgs"),
	}
	outs := make([]Outcome, len(ds))
	h.HandleBatch(t.Context(), ds, outs)
	for i, want := range []struct {
		kind      OutcomeKind
		duplicate bool
	}{{OutcomeAck, false}, {OutcomeAck, true}, {OutcomeDrop, false}, {OutcomeAck, false}, {OutcomeAck, false}, {OutcomeFailed, false}} {
		if o := outs[i]; o.Kind != want.kind || o.Duplicate != want.duplicate {
			t.Errorf("record %d: %v (duplicate %v, err %v), want %v (duplicate %v)", i, o.Kind, o.Duplicate, o.Err, want.kind, want.duplicate)
		}
	}
	if o := outs[5]; o.Failure != FailureOther || !strings.Contains(o.Err.Error(), "refused") {
		t.Errorf("past the stream's limits: %+v, want failed (other), refused", o)
	}
	var got []string
	for _, m := range srv.Messages("ORDERS") {
		got = append(got, string(m.Data()))
	}
	if want := []string{"first", "second", "no id", "fourth"}; !slices.Equal(got, want) {
		t.Errorf("the stream holds %q, want %q", got, want)
	}

	srv.Stop()
	h.HandleBatch(t.Context(), ds[:2], outs[:2])
	for i, o := range outs[:2] {
		if o.Kind != OutcomeFailed || o.Failure != FailureTimeout && o.Failure != FailureUnreachable {
			t.Errorf("server stopped, record %d: %+v, want failed (timeout or unreachable)", i, o)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	h.HandleBatch(ctx, ds[:2], outs[:2])
	for i, o := range outs[:2] {
		if o.Kind != OutcomeFailed || o.Failure != FailureCanceled {
			t.Errorf("cancelled, record %d: %+v, want failed (canceled)", i, o)
		}
	}
}

// TestNATSHandlerBatchAgain: batches one after the other, of records with
// fewer headers, fewer records, a record without a file (no Nats-Msg-Id):
// each message in the stream carries its record's fields and payload, and
// nothing of the records before (TestNATSBatchMadeAgain makes sure the
// messages are made again).
func TestNATSHandlerBatchAgain(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	h := mustNewHandler(t, natsConfig(srv)).(BatchHandler)
	record := func(offset int64, headers int) Delivery {
		d := *testDelivery()
		d.File, d.Offset, d.Seq, d.Payload = "abc", offset, uint64(offset), []byte(strconv.FormatInt(offset, 10))
		d.Headers = d.Headers[:headers]
		return d
	}
	noFile := record(9, 0)
	noFile.File = ""
	var sent []Delivery
	for _, ds := range [][]Delivery{
		{record(1, 4), record(2, 4), record(3, 4)},
		{record(4, 1), record(5, 0)},
		{record(6, 2), record(7, 4), record(8, 3), noFile},
	} {
		outs := make([]Outcome, len(ds))
		h.HandleBatch(t.Context(), ds, outs)
		for i, o := range outs {
			checkOutcome(t, o, OutcomeAck, 0, 0, "")
			sent = append(sent, ds[i])
		}
	}
	msgs := srv.Messages("ORDERS")
	if len(msgs) != len(sent) {
		t.Fatalf("the stream holds %d messages, want %d", len(msgs), len(sent))
	}
	for i, m := range msgs {
		if want := newNATSMessage(&sent[i]).Header; !maps.EqualFunc(m.Headers(), want, slices.Equal) {
			t.Errorf("message %d: headers %v, want %v", i, m.Headers(), want)
		}
		if string(m.Data()) != string(sent[i].Payload) {
			t.Errorf("message %d: payload %q, want %q", i, m.Data(), sent[i].Payload)
		}
	}
}

// TestNATSBatchMadeAgain: a batch's messages, made again for a smaller
// batch of records with fewer headers, carry each new record's fields and
// nothing of the records before, and a reset batch holds no record.
func TestNATSBatchMadeAgain(t *testing.T) {
	record := func(offset int64, headers int) *Delivery {
		d := testDelivery()
		d.File, d.Offset, d.Seq, d.Payload = "abc", offset, uint64(offset), []byte(strconv.FormatInt(offset, 10))
		d.Headers = d.Headers[:headers]
		return d
	}
	noFile := record(6, 1)
	noFile.File = ""
	var b natsBatch
	for _, ds := range [][]*Delivery{
		{record(1, 4), record(2, 4), record(3, 4)},
		{record(4, 0), noFile},
	} {
		b.start(len(ds))
		for i, d := range ds {
			m := b.message(i, "orders.orders", d)
			if want := newNATSMessage(d).Header; !maps.EqualFunc(m.Header, want, slices.Equal) || string(m.Data) != string(d.Payload) {
				t.Errorf("record at %d: message %v %q, want %v %q", d.Offset, m.Header, m.Data, want, d.Payload)
			}
		}
		b.reset(len(ds))
		for i, m := range b.msgs {
			if len(m.Header) != 0 || m.Data != nil {
				t.Errorf("message %d after reset: %v %q, want empty", i, m.Header, m.Data)
			}
		}
	}
}

// TestNATSHandlerBatchCancelled: a batch handed over after ctx ended
// publishes nothing, and a batch whose acknowledgements do not come
// returns as soon as ctx ends, well before the handler's timeout; each
// record is failed (cancelled).
func TestNATSHandlerBatchCancelled(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	cfg := natsConfig(srv)
	cfg.Timeout = conf.Duration(time.Minute)
	h := mustNewHandler(t, cfg).(BatchHandler)
	ds := make([]Delivery, 3)
	for i := range ds {
		ds[i] = *testDelivery()
		ds[i].File, ds[i].Offset = "abc", int64(i)
	}
	outs := make([]Outcome, len(ds))
	checkCancelled := func(what string) {
		t.Helper()
		for i, o := range outs {
			if o.Kind != OutcomeFailed || o.Failure != FailureCanceled {
				t.Errorf("%s, record %d: %+v, want failed (canceled)", what, i, o)
			}
		}
	}

	ended, cancel := context.WithCancel(t.Context())
	cancel()
	h.HandleBatch(ended, ds, outs)
	checkCancelled("ctx ended before")
	if n := len(srv.Messages("ORDERS")); n != 0 {
		t.Errorf("a batch handed over after ctx ended published %d messages", n)
	}

	// The stream goes, and a subscriber that never answers takes its
	// subject: the publishes wait for acknowledgements that never come.
	nc, js := srv.Connect()
	if err := js.DeleteStream(t.Context(), "ORDERS"); err != nil {
		t.Fatal(err)
	}
	silent, err := nc.SubscribeSync("orders.eu")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.HandleBatch(ctx, ds, outs)
	}()
	for range ds {
		if _, err := silent.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("the batch's publishes did not arrive: %v", err)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("HandleBatch did not return once ctx ended")
	}
	checkCancelled("ctx ended while waiting")
}

// TestNATSHandlerStreamGone: a publish that no stream answers (the stream
// deleted after the start) fails, saying so rather than the client's "no
// responders".
func TestNATSHandlerStreamGone(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	h := mustNewHandler(t, natsConfig(srv))
	_, js := srv.Connect()
	if err := js.DeleteStream(t.Context(), "ORDERS"); err != nil {
		t.Fatal(err)
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeFailed, 0, 0, `no JetStream stream answered on subject "orders.eu"`)
}

// TestNATSHandlerReconnected: the handler tells when its connection comes
// back after the server was gone, so that held deliveries go at once.
func TestNATSHandlerReconnected(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	h := mustNewHandler(t, natsConfig(srv)).(Reconnecting)
	back := h.Reconnected()
	srv.Stop()
	select {
	case <-back:
		t.Fatal("Reconnected's channel closed while the server is down")
	default:
	}
	srv.Restart()
	select {
	case <-back:
	case <-time.After(30 * time.Second):
		t.Fatal("Reconnected's channel not closed after the server came back")
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeAck, 0, 0, "")
}

// TestNATSHandlerSubscriptionsShareNoID: two subscriptions forwarding one
// record into one stream, under two subjects, store two messages.
func TestNATSHandlerSubscriptionsShareNoID(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	raw, audit := natsConfig(srv), natsConfig(srv)
	raw.Subject, audit.Subject = "orders.raw", "orders.audit"
	for _, sub := range []struct {
		name string
		cfg  conf.Handler
	}{{"raw", raw}, {"audit", audit}} {
		d := testDelivery()
		d.Subscription, d.File, d.Offset = sub.name, "abc", 4096
		if o := mustNewHandler(t, sub.cfg).Handle(t.Context(), d); o.Kind != OutcomeAck || o.Duplicate {
			t.Errorf("subscription %s: %+v, want an ack that is no duplicate", sub.name, o)
		}
	}
	if n := len(srv.Messages("ORDERS")); n != 2 {
		t.Errorf("the stream holds %d messages, want 2", n)
	}
}

// TestNATSHandlerStartsWithoutServers: a handler built while no server
// answers (the daemon starting during an outage) fails its deliveries
// until one does, then looks for its stream and publishes; check-config
// refuses the unreachable servers.
func TestNATSHandlerStartsWithoutServers(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	cfg := natsConfig(srv)
	srv.Stop()
	check := &conf.Config{Subscriptions: []conf.Subscription{{Name: "billing", Key: "eu", Handler: cfg}}}
	if err := Check(check); err == nil || !strings.Contains(err.Error(), "connecting to "+cfg.URL) {
		t.Fatalf("Check while no server answers: %v, want the servers named", err)
	}
	var logs testutil.SyncBuffer
	h, err := New(t.Context(), cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("New while no server answers: %v", err)
	}
	defer Close(h)
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	if o := h.Handle(t.Context(), d); o.Kind != OutcomeFailed || o.Failure != FailureUnreachable {
		t.Fatalf("no server: %+v, want failed (unreachable)", o)
	}
	srv.Restart()
	deadline := time.Now().Add(15 * time.Second)
	for o := h.Handle(t.Context(), d); o.Kind != OutcomeAck; o = h.Handle(t.Context(), d) {
		if time.Now().After(deadline) {
			t.Fatalf("the server is back, but deliveries still fail: %+v", o)
		}
		time.Sleep(50 * time.Millisecond) // the client reconnects on its own schedule (every 2 s)
	}
	// The stream check runs once connected, beside the deliveries.
	for !strings.Contains(logs.String(), "subject=orders.eu stream=ORDERS") {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say it found the stream:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "not connected to NATS yet") || strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the log does not say it waited for the servers, or has an error:\n%s", logs.String())
	}
}

// TestNATSHandlerStartTriesOnce: a handler whose server accepts the
// connection but never answers starts after one try, not two (a
// daemon's start waits for it), and says why it waits.
func TestNATSHandlerStartTriesOnce(t *testing.T) {
	silent := natstest.StartSilent(t)
	var logs testutil.SyncBuffer
	cfg := conf.Handler{Kind: conf.HandlerNATS, URL: silent.URL(), Subject: "orders.eu", Timeout: conf.Duration(300 * time.Millisecond)}
	h, err := New(t.Context(), cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer Close(h)
	if n := len(silent.Accepts()); n != 1 {
		t.Errorf("New tried %d connections, want 1", n)
	}
	// The reason comes from the client's goroutine.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "connecting to NATS failed; trying again") ||
		!strings.Contains(logs.String(), "timeout"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the log does not say why the handler cannot connect:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), "not connected to NATS yet") {
		t.Errorf("the log does not say the handler waits for its servers:\n%s", logs.String())
	}
}

// TestCheckAtOnce: check-config tries the servers of every subscription at
// once, so that it waits for the slowest rather than for all in turn, and
// names each that failed.
func TestCheckAtOnce(t *testing.T) {
	t.Parallel()
	silent := natstest.StartSilent(t)
	cfg := conf.Handler{Kind: conf.HandlerNATS, URL: silent.URL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second)}
	err := Check(&conf.Config{Subscriptions: []conf.Subscription{{Name: "a", Handler: cfg}, {Name: "b", Handler: cfg}}})
	if err == nil || !strings.Contains(err.Error(), `subscription "a"`) || !strings.Contains(err.Error(), `subscription "b"`) {
		t.Errorf("Check: %v, want both subscriptions named", err)
	}
	// One after the other, the second would come after the first's timeout.
	if at := silent.Accepts(); len(at) != 2 || at[1].Sub(at[0]) > 500*time.Millisecond {
		t.Errorf("connections at %v, want 2 at once", at)
	}
}

// TestNATSHandlerClosedForGood: when the client closes its connection for
// good (here the server says an -ERR the client does not know), the
// handler connects anew, says so, and its deliveries go through again.
func TestNATSHandlerClosedForGood(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	proxy := natstest.StartProxy(t, srv.URL())
	cfg := natsConfig(srv)
	cfg.URL = proxy.URL()
	var logs testutil.SyncBuffer
	h, err := New(t.Context(), cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer Close(h)
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")

	back := h.(Reconnecting).Reconnected()
	proxy.Say("-ERR 'Something Unheard Of'\r\n")
	select {
	case <-back:
	case <-time.After(15 * time.Second):
		t.Fatalf("the held deliveries were not woken by a connection made anew:\n%s", logs.String())
	}
	d.Offset++
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
	if !strings.Contains(logs.String(), "closed its connection for good") || !strings.Contains(logs.String(), "connected to NATS anew") {
		t.Errorf("the log does not say the connection closed for good and was made anew:\n%s", logs.String())
	}
	if n := len(proxy.Accepts()); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// TestNATSHandlerClosedForGoodNoServer: a connection closed for good while
// no server answers is made anew without one: the handler says so, and
// does not say it connected, nor wake the held deliveries, until a server
// answers.
func TestNATSHandlerClosedForGoodNoServer(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	proxy := natstest.StartProxy(t, srv.URL())
	cfg := natsConfig(srv)
	cfg.URL, cfg.Timeout = proxy.URL(), conf.Duration(500*time.Millisecond)
	var logs testutil.SyncBuffer
	h, err := New(t.Context(), cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer Close(h)
	back := h.(Reconnecting).Reconnected()
	proxy.Silence(true)
	proxy.Say("-ERR 'Something Unheard Of'\r\n")
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(logs.String(), "connecting to NATS anew: no server answers yet"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("connecting anew without a server is not said:\n%s", logs.String())
		}
	}
	select {
	case <-back:
		t.Fatalf("the held deliveries were woken while no server answers:\n%s", logs.String())
	default:
	}
	if strings.Contains(logs.String(), "connected to NATS anew") {
		t.Fatalf("the handler says it connected while no server answers:\n%s", logs.String())
	}
	proxy.Silence(false)
	select {
	case <-back:
	case <-time.After(15 * time.Second):
		t.Fatalf("the held deliveries were not woken once a server answered:\n%s", logs.String())
	}
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
}

// TestNATSHandlerRefusedFromTheStart: a handler whose credentials the
// server refuses from its first try says so in the first failed delivery,
// before the client's own last error knows it.
func TestNATSHandlerRefusedFromTheStart(t *testing.T) {
	t.Parallel()
	auth := &switchAuth{}
	srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		CustomClientAuthentication: auth})
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerNATS, URL: srv.ClientURL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second)})
	for deadline := time.Now().Add(20 * time.Second); h.(*natsHandler).dialErr.Load() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no failed try to connect after %d refusals", auth.refused.Load())
		}
	}
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	if o := h.Handle(t.Context(), d); o.Failure != FailureUnreachable || !strings.Contains(strings.ToLower(o.Err.Error()), "authorization violation") {
		t.Errorf("credentials refused from the start: %+v, want failed (unreachable), with the refusal", o)
	}
}

// TestNATSHandlerOutlivesRefusedCredentials: a server that refuses the
// client for a while (credentials being rotated) and then accepts it
// again gets its publishes again; by default the client would give up
// for good after two refusals in a row.
func TestNATSHandlerOutlivesRefusedCredentials(t *testing.T) {
	t.Parallel()
	auth := &switchAuth{}
	auth.accept.Store(true)
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		CustomClientAuthentication: auth}
	srv := startServer(t, opts)
	opts.Port = srv.Addr().(*net.TCPAddr).Port
	addOrders(t, srv)
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerNATS, URL: srv.ClientURL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second)})
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")

	auth.accept.Store(false)
	srv.Shutdown()
	srv.WaitForShutdown()
	startServer(t, opts) // on the same port and store; the cleanup stops it
	// Three refusals: the client went on after the second.
	for deadline := time.Now().Add(20 * time.Second); auth.refused.Load() < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the client stopped trying after %d refusals", auth.refused.Load())
		}
	}
	// The client retries refused credentials without a word: the failed
	// delivery says why it cannot connect.
	if o := h.Handle(t.Context(), d); o.Failure != FailureUnreachable || !strings.Contains(strings.ToLower(o.Err.Error()), "(last error: nats: authorization violation)") {
		t.Errorf("credentials refused: %+v, want failed (unreachable), with the refusal", o)
	}
	auth.accept.Store(true)
	deadline := time.Now().Add(15 * time.Second)
	for o := h.Handle(t.Context(), d); o.Kind != OutcomeAck; o = h.Handle(t.Context(), d) {
		if time.Now().After(deadline) {
			t.Fatalf("the server accepts the client again, but deliveries still fail: %+v", o)
		}
		time.Sleep(50 * time.Millisecond) // the client reconnects on its own schedule (every 2 s)
	}
}

// TestNATSHandlerFiles: a file the client reads to connect that cannot
// serve refuses the start, naming its key; a valid credentials file
// connects.
func TestNATSHandlerFiles(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	missing := filepath.Join(t.TempDir(), "missing")
	notPEM := writeTestFile(t, "not.pem", "not a certificate\n")
	tests := []struct {
		name string
		set  func(*conf.Handler)
		want string
	}{
		{"creds_file missing", func(c *conf.Handler) { c.CredsFile = missing }, "creds_file: open " + missing},
		{"creds_file without a JWT", func(c *conf.Handler) { c.CredsFile = notPEM }, "creds_file: " + notPEM + " holds no user JWT"},
		{"creds_file without a seed", func(c *conf.Handler) { c.CredsFile = writeTestFile(t, "jwt.creds", userCreds(t)[0]) }, "holds no user seed"},
		{"creds_file with another user's seed", func(c *conf.Handler) { c.CredsFile = writeTestFile(t, "mixed.creds", userCreds(t)[0]+userCreds(t)[1]) }, "its seed is not that of the user of its JWT"},
		{"nkey_file missing", func(c *conf.Handler) { c.NkeyFile = missing }, "nkey_file: open " + missing},
		{"nkey_file without a seed", func(c *conf.Handler) { c.NkeyFile = notPEM }, "nkey_file: " + notPEM + " holds no nkey seed"},
		{"nkey_file with an account seed", func(c *conf.Handler) { c.NkeyFile = writeTestFile(t, "account.nk", accountSeed(t)) }, "holds no user nkey seed"},
		{"ca_file missing", func(c *conf.Handler) { c.CAFile = missing }, "ca_file: nats: error loading or parsing rootCA file"},
		{"ca_file not PEM", func(c *conf.Handler) { c.CAFile = notPEM }, "ca_file: nats: failed to parse root certificate"},
		{"cert_file missing", func(c *conf.Handler) { c.CertFile, c.KeyFile = missing, notPEM }, "cert_file and key_file: nats: error loading client certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := natsConfig(srv)
			tc.set(&cfg)
			if _, err := New(t.Context(), cfg, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error with %q", err, tc.want)
			}
		})
	}
	cfg := natsConfig(srv)
	creds := userCreds(t)
	cfg.CredsFile = writeTestFile(t, "user.creds", creds[0]+creds[1])
	h := mustNewHandler(t, cfg)
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
}

// userCreds returns the two parts of a NATS user credentials file: the
// decorated user JWT, and the decorated user seed.
func userCreds(t *testing.T) [2]string {
	t.Helper()
	account, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	token, err := jwt.NewUserClaims(pub).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	decoratedJWT, err := jwt.DecorateJWT(token)
	if err != nil {
		t.Fatal(err)
	}
	decoratedSeed, err := jwt.DecorateSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	return [2]string{string(decoratedJWT), string(decoratedSeed)}
}

// accountSeed returns the seed of a new account nkey.
func accountSeed(t *testing.T) string {
	t.Helper()
	account, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := account.Seed()
	return string(seed)
}

// switchAuth accepts or refuses every client, as accept says, and counts
// the refusals.
type switchAuth struct {
	accept  atomic.Bool
	refused atomic.Int32
}

func (a *switchAuth) Check(server.ClientAuthentication) bool {
	if a.accept.Load() {
		return true
	}
	a.refused.Add(1)
	return false
}

// addOrders creates the stream ORDERS, capturing orders.>, on srv,
// connecting with opts.
func addOrders(t *testing.T, srv *server.Server, opts ...nats.Option) {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
}

// startServer starts a NATS server with opts; the test's cleanup stops it.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server: not ready for connections after 10s")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// BenchmarkNATSHeader: the headers of a plain record forwarded from a file
// (its stream-sequence, the delivery's metadata, Nats-Msg-Id) in a message
// of a batch made again, as publishing does for each record, and their
// encoding by the client library.
func BenchmarkNATSHeader(b *testing.B) {
	d := &Delivery{Subscription: "bench", Key: "orders", Seq: 123456, TimestampMs: 1700000000500,
		Headers: envelope.Headers{{Name: envelope.SequenceHeader, Value: []byte("123456")}},
		File:    "0123456789abcdef01234567", Offset: 987654321, Payload: make([]byte, 512)}
	var batch natsBatch
	b.ReportAllocs()
	for b.Loop() {
		batch.start(1)
		if batch.message(0, "orders.orders", d).Size() == 0 {
			b.Fatal("no size")
		}
		batch.reset(1)
	}
}

// newNATSMessage returns d's message as a new batch makes it.
func newNATSMessage(d *Delivery) *nats.Msg {
	var b natsBatch
	b.start(1)
	return b.message(0, "orders.orders", d)
}

// TestNATSHandlerStopBounded: a stop does not wait for the timeout of a
// server that accepts the connection and never answers: Close ends a
// reconnection under way, and the end of New's context a first
// connection.
func TestNATSHandlerStopBounded(t *testing.T) {
	const timeout = time.Minute // what the stop would wait
	tests := []struct {
		name string
		stop func(t *testing.T) (stop func(), stopped func() error)
	}{
		{"Close while reconnecting", func(t *testing.T) (func(), func() error) {
			srv := natstest.Start(t)
			srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
			proxy := natstest.StartProxy(t, srv.URL())
			h, err := New(t.Context(), conf.Handler{Kind: conf.HandlerNATS, URL: proxy.URL(), Subject: "orders.eu", Timeout: conf.Duration(timeout)}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			proxy.Hang()
			awaitAccepts(t, proxy.Accepts, 2) // the reconnection, in its handshake
			return func() { Close(h) }, func() error { return nil }
		}},
		{"New's context ended", func(t *testing.T) (func(), func() error) {
			silent := natstest.StartSilent(t)
			ctx, cancel := context.WithCancel(t.Context())
			built := make(chan error, 1)
			go func() {
				h, err := New(ctx, conf.Handler{Kind: conf.HandlerNATS, URL: silent.URL(), Subject: "orders.eu", Timeout: conf.Duration(timeout)}, nil, nil)
				if err == nil {
					Close(h)
				}
				built <- err
			}()
			awaitAccepts(t, silent.Accepts, 1)
			return cancel, func() error {
				if err := <-built; err == nil || !strings.Contains(err.Error(), "told to stop") {
					return fmt.Errorf("New: %v, want an error saying it was told to stop", err)
				}
				return nil
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stop, stopped := tc.stop(t)
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				stop()
				done <- stopped()
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("not stopped after %s: the stop waits for the timeout (%s) of a server that never answers", time.Since(start), timeout)
			}
		})
	}
}

// awaitAccepts waits until accepts (a fake server's) counts n connections.
func awaitAccepts(t *testing.T, accepts func() []time.Time, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); len(accepts()) < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections after 20s, want %d", len(accepts()), n)
		}
	}
}

// TestNATSHandlerClosedForGoodAgain: a server that closes each connection
// for good right after the handshake (an error the client does not know)
// is connected to anew at once the first time, then after a wait that
// grows from the timeout: a few connections and log lines, not one each
// few milliseconds.
func TestNATSHandlerClosedForGoodAgain(t *testing.T) {
	t.Parallel()
	erring := natstest.StartErring(t, "-ERR 'Something Unheard Of'\r\n")
	var logs testutil.SyncBuffer
	cfg := conf.Handler{Kind: conf.HandlerNATS, URL: erring.URL(), Subject: "orders.eu", Timeout: conf.Duration(300 * time.Millisecond)}
	h, err := New(t.Context(), cfg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer Close(h)
	// Waits of 0, 300 ms, 600 ms, 1.2 s: 5 connections in 2.1 s, the
	// first at New.
	time.Sleep(2 * time.Second)
	n := len(erring.Accepts())
	if n < 3 || n > 6 {
		t.Errorf("%d connections in 2 s, want 3 to 6 (made anew after a growing wait)", n)
	}
	if lines := strings.Count(logs.String(), "closed its connection for good"); lines > 6 {
		t.Errorf("%d log lines of connections closed for good in 2 s, want at most 6", lines)
	}
	t.Logf("%d connections", n)
}

// TestNATSHandlerClosedBeforeStored: a connection the client closed for
// good before the build stored it is made anew all the same: the new one
// takes the empty place (the build then stores its own only if the place
// is still empty).
func TestNATSHandlerClosedBeforeStored(t *testing.T) {
	srv := natstest.Start(t)
	srv.AddStream(jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	h, err := New(t.Context(), natsConfig(srv), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(h)
	nh := h.(*natsHandler)
	built := nh.conn.Load()
	built.nc.Close()
	nh.conn.Store(nil) // as before the build stored it
	nh.connectAnew(built.nc, 0)
	made := nh.conn.Load()
	if made == nil || made.nc == built.nc || !made.nc.IsConnected() {
		t.Fatalf("connecting anew before the build stored its connection left %+v in place, want a new connected one", made)
	}
	checkOutcome(t, h.Handle(t.Context(), testDelivery()), OutcomeAck, 0, 0, "")
}

// TestNATSHandlerNkeyReadOnce: the handler signs with the seed nkey_file
// held when it was built: the file rotated (another seed) or removed
// meanwhile does not keep a connection made anew from authenticating,
// as it would if the file were read again at each connection (a reload
// builds the handler again with the new file).
func TestNATSHandlerNkeyReadOnce(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, path string)
	}{
		{"rotated", func(t *testing.T, path string) {
			other, err := nkeys.CreateUser()
			if err != nil {
				t.Fatal(err)
			}
			seed, _ := other.Seed()
			if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"removed", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			user, err := nkeys.CreateUser()
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := user.PublicKey()
			seed, _ := user.Seed()
			srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
				Nkeys: []*server.NkeyUser{{Nkey: pub}}})
			addOrders(t, srv, nats.Nkey(pub, user.Sign))
			proxy := natstest.StartProxy(t, srv.ClientURL())
			cfg := conf.Handler{Kind: conf.HandlerNATS, URL: proxy.URL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second),
				NkeyFile: writeTestFile(t, "user.nk", string(seed)+"\n")}
			h := mustNewHandler(t, cfg)
			d := testDelivery()
			d.File, d.Offset = "abc", 1
			checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")

			tc.change(t, cfg.NkeyFile)
			back := h.(Reconnecting).Reconnected()
			proxy.Say("-ERR 'Something Unheard Of'\r\n") // closed for good: connected anew
			select {
			case <-back:
			case <-time.After(15 * time.Second):
				t.Fatal("no connection made anew after nkey_file changed")
			}
			d.Offset++
			checkOutcome(t, h.Handle(t.Context(), d), OutcomeAck, 0, 0, "")
		})
	}
}

// TestNATSHandlerPublishDenied: a user the server does not let publish to
// the subject gets no acknowledgement: the failed delivery says the
// server's permissions violation and how to mend it, not only that the
// acknowledgement timed out.
func TestNATSHandlerPublishDenied(t *testing.T) {
	t.Parallel()
	srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "admin", Password: "a"},
			{Username: "forwarder", Password: "f", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"$JS.API.>"}}}},
		}})
	addOrders(t, srv, nats.UserInfo("admin", "a"))
	cfg := conf.Handler{Kind: conf.HandlerNATS, URL: srv.ClientURL(), Subject: "orders.eu", Timeout: conf.Duration(500 * time.Millisecond),
		User: "forwarder", PasswordFile: writeTestFile(t, "password", "f\n")}
	h := mustNewHandler(t, cfg)
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	out := h.Handle(t.Context(), d)
	checkOutcome(t, out, OutcomeFailed, 0, 0, `Permissions Violation for Publish to "orders.eu"`)
	if out.Failure != FailureOther || !strings.Contains(out.Err.Error(), "grant the user") {
		t.Errorf("failure %v, err %v; want another failure than a timeout, saying how to mend it", out.Failure, out.Err)
	}
}

// TestNATSHandlerCheckHints: what the check of a start finds wrong says
// how to mend it: a server without JetStream, refused credentials (placed
// at the credential's key, not the url's), no stream for the subject (the
// stream the README's example makes).
func TestNATSHandlerCheckHints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		opts   server.Options
		cfg    func(*conf.Handler)
		option string
		want   string
	}{
		{"no JetStream", server.Options{}, func(*conf.Handler) {}, "url", "JetStream is not enabled"},
		{"refused password", server.Options{JetStream: true, Users: []*server.User{{Username: "u", Password: "right"}}},
			func(c *conf.Handler) { c.User, c.PasswordFile = "u", writeTestFile(t, "password", "wrong\n") }, "password_file", "Authorization Violation: the server refuses the credentials of password_file"},
		{"no stream", server.Options{JetStream: true}, func(*conf.Handler) {}, "subject", "--dupe-window 5m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			opts.Host, opts.Port, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, t.TempDir(), true, true
			srv := startServer(t, &opts)
			cfg := conf.Handler{Kind: conf.HandlerNATS, URL: srv.ClientURL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second)}
			tc.cfg(&cfg)
			_, err := build(t.Context(), cfg, nil, nil, true)
			oe, ok := errors.AsType[*OptionError](err)
			if !ok || oe.Option != tc.option || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v (option %v), want one of option %s containing %q", err, oe, tc.option, tc.want)
			}
		})
	}
}

// TestNATSHandlerTLSRefused: a server whose certificate the client does
// not trust (no ca_file naming its authority) fails each delivery with
// reason tls, not unreachable, and says why.
func TestNATSHandlerTLSRefused(t *testing.T) {
	t.Parallel()
	ts := httptest.NewTLSServer(nil) // for its certificate, of 127.0.0.1, by an authority of its own
	cert := ts.TLS.Certificates[0]
	ts.Close()
	srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		TLS: true, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	url := fmt.Sprintf("tls://127.0.0.1:%d", srv.Addr().(*net.TCPAddr).Port)
	h := mustNewHandler(t, conf.Handler{Kind: conf.HandlerNATS, URL: url, Subject: "orders.eu", Timeout: conf.Duration(time.Second)})
	for deadline := time.Now().Add(20 * time.Second); h.(*natsHandler).dialErr.Load() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no failed try to connect")
		}
	}
	d := testDelivery()
	d.File, d.Offset = "abc", 1
	if o := h.Handle(t.Context(), d); o.Kind != OutcomeFailed || o.Failure != FailureTLS || !strings.Contains(o.Err.Error(), "certificate") {
		t.Errorf("certificate not trusted: %+v, want failed (tls), naming the certificate", o)
	}
}
