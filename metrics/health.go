package metrics

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Health is the health of the subscriptions that have a
// [SubscriptionMetrics] handle, as /healthz reports it. Handles set it
// ([SubscriptionMetrics.SetHealthy]) and remove their part of it; get it
// from [Metrics.Health]. A nil *Health has no subscriptions. It is safe
// for concurrent use.
type Health struct {
	mu            sync.Mutex
	subscriptions map[string]*healthState
}

// healthState is one subscription's health, owned by its handle. A removed
// handle's state is no longer in the map, so setting it changes nothing.
type healthState struct {
	ok     bool
	reason string
}

// lineBreaks keeps a multi-line reason on its subscription's line.
var lineBreaks = strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ")

func (h *Health) add(name string, st *healthState) {
	h.mu.Lock()
	h.subscriptions[name] = st
	h.mu.Unlock()
}

func (h *Health) remove(name string) {
	h.mu.Lock()
	delete(h.subscriptions, name)
	h.mu.Unlock()
}

func (h *Health) set(st *healthState, ok bool, reason string) {
	h.mu.Lock()
	st.ok, st.reason = ok, reason
	h.mu.Unlock()
}

// Err returns nil when every subscription is healthy, and otherwise one
// error per unhealthy subscription, in name order, joined with
// [errors.Join]: each reads `subscription "name": reason`, on one line.
func (h *Health) Err() error {
	if h == nil {
		return nil
	}
	type problem struct{ name, reason string }
	var problems []problem
	h.mu.Lock()
	for name, st := range h.subscriptions {
		if !st.ok {
			problems = append(problems, problem{name, st.reason})
		}
	}
	h.mu.Unlock()
	slices.SortFunc(problems, func(a, b problem) int { return strings.Compare(a.name, b.name) })
	errs := make([]error, len(problems))
	for i, p := range problems {
		errs[i] = fmt.Errorf("subscription %q: %s", p.name, cmp.Or(lineBreaks.Replace(p.reason), "unhealthy"))
	}
	return errors.Join(errs...)
}
