package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/streamfile"
)

// blindRecorder is a recorder that declares it reads no records
// (handler.Blind), as discard does.
type blindRecorder struct{ *recorder }

func (blindRecorder) Blind() bool { return true }

// blindRecords are records of every kind the daemon decides on: plain,
// rs1 and rs2 envelopes, a record whose header block names another origin
// but whose text is broken after the block (so it is plain, and delivered),
// a copy of another subscription (passed over), and a copy with a count
// (one attempt from the cap).
func blindRecords() [][]byte {
	var tenant, note, foreign, counted envelope.Headers
	tenant.Set("x-tenant", []byte("acme"))
	note.Set("x-note", []byte("two\nlines"))
	foreign.Set(OriginHeader, []byte("billing"))
	foreign.SetRetryCount(1)
	counted.SetRetryCount(1)
	counted.Set("x-tenant", []byte("acme"))
	broken := envelope.Encode(foreign, []byte(strings.Repeat("payload ", 8)), false)
	broken[len(broken)-6] = '!'
	return [][]byte{
		[]byte("a"),
		envelope.Encode(tenant, []byte("b"), false),
		envelope.Encode(note, []byte("c"), false),
		broken,
		envelope.Encode(foreign, []byte("d"), false),
		envelope.Encode(counted, []byte("e"), false),
	}
}

// TestRunBlindHandler: a handler that reads no records (discard) gets the
// metadata of each delivery alone, the daemon checking an envelope only
// where it decides something; the outcome is settled exactly as for a
// handler that reads them. The same records and answers (a retry of
// every delivery, max_attempts = 2, a dead-letter key) leave the same
// file, byte for byte, the same deliveries and the same passed-over copy,
// with one worker; with several, whose copies come in any order and so
// with other sequences, the same records but for their stream-sequence
// headers.
func TestRunBlindHandler(t *testing.T) {
	t.Parallel()
	records := blindRecords()
	// Each record but the foreign copy is delivered; a record without a
	// count gets a copy, which is delivered and goes to the dead letter.
	const delivered, frames = 9, 15
	run := func(t *testing.T, h handler.Handler, concurrency int) (*runEnv, *runningDaemon) {
		e := newRunEnv(t, runSub("audit", "orders",
			fmt.Sprintf("max_attempts = 2\ndead_letter = \"orders.dead\"\nconcurrency = %d", concurrency)))
		var fs []streamfile.Frame
		for _, rec := range records {
			fs = append(fs, streamfile.Frame{Key: "orders", Payload: rec})
		}
		e.write(true, fs...)
		r := e.start(map[string]handler.Handler{"audit": h})
		waitFor(t, "every copy and dead letter", func() bool {
			return len(e.records("")) == frames && r.metric("audit", "retry") == delivered
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		return e, r
	}
	// written is the file's records as "key record", sorted; with several
	// workers without their stream-sequence headers.
	written := func(e *runEnv, concurrency int) []string {
		var out []string
		for _, r := range e.records("") {
			rec := r.raw
			if concurrency > 1 {
				r.headers.Delete(envelope.SequenceHeader)
				rec = envelope.Encode(r.headers, []byte(r.payload), false)
			}
			out = append(out, fmt.Sprintf("%s %q", r.key, rec))
		}
		slices.Sort(out)
		return out
	}
	reader := newRecorder(func(context.Context, *handler.Delivery) handler.Outcome { return retry })
	want, _ := run(t, reader, 1)
	if n := len(reader.deliveries()); n != delivered {
		t.Fatalf("the reading handler got %d deliveries, want %d", n, delivered)
	}
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency_%d", concurrency), func(t *testing.T) {
			blind := blindRecorder{newRecorder(func(context.Context, *handler.Delivery) handler.Outcome { return retry })}
			e, r := run(t, blind, concurrency)
			if got, want := written(e, concurrency), written(want, concurrency); !slices.Equal(got, want) {
				t.Fatalf("blind handler: the file holds\n%s\nwant, as with a handler that reads records,\n%s",
					strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if n := r.metric("audit", "foreign_copy"); n != 1 {
				t.Errorf("%v foreign copies passed over, want 1", n)
			}
			got := blind.deliveries()
			if len(got) != delivered {
				t.Fatalf("%d deliveries, want %d", len(got), delivered)
			}
			for _, d := range got {
				if d.Headers != nil || d.Payload != nil || d.Attempt != 0 || d.Key != "orders" || d.Seq == 0 || d.File == "" {
					t.Errorf("delivery seq %d: headers %v, payload %q, attempt %d, key %q, file %q; want the metadata alone",
						d.Seq, d.Headers, d.Payload, d.Attempt, d.Key, d.File)
				}
			}
		})
	}
}
