package daemon

import (
	"testing"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/handler"
	"github.com/streamd/streamd/internal/natstest"
)

// TestNewHandlersAtOnce: the handlers of a start or a reload are built at
// once, so that nats handlers whose servers do not answer delay the start
// by one timeout, not by one each.
func TestNewHandlersAtOnce(t *testing.T) {
	silent := natstest.StartSilent(t)
	cfg := conf.Handler{Kind: conf.HandlerNATS, URL: silent.URL(), Subject: "orders.eu", Timeout: conf.Duration(time.Second)}
	s := newSetup(Options{})
	subs := []conf.Subscription{{Name: "a", Handler: cfg}, {Name: "b", Handler: cfg}}
	hs, err := s.newHandlers(t.Context(), &conf.Config{Subscriptions: subs}, subs)
	if err != nil {
		t.Fatalf("newHandlers: %v (handlers whose servers do not answer start waiting for them)", err)
	}
	for _, h := range hs {
		handler.Close(h)
	}
	// One after the other, the second would come after the first's timeout.
	if at := silent.Accepts(); len(at) != 2 || at[1].Sub(at[0]) > 500*time.Millisecond {
		t.Errorf("connections at %v, want 2 at once", at)
	}
}
