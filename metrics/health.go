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
	problems      map[string]string // of the whole daemon, by what has it
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

// SetProblem records a problem of the whole daemon, such as commits of
// the positions that fail, under what; an empty reason clears it. It
// reports whether a problem was recorded under what before.
func (h *Health) SetProblem(what, reason string) (had bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, had = h.problems[what]
	if reason == "" {
		delete(h.problems, what)
		return had
	}
	if h.problems == nil {
		h.problems = make(map[string]string)
	}
	h.problems[what] = reason
	return had
}

// Err returns nil when every subscription is healthy and the daemon has
// no problem, and otherwise one error per problem, in name order, then
// one per unhealthy subscription, in name order, joined with
// [errors.Join]: each reads `what: reason` or `subscription "name":
// reason`, on one line.
func (h *Health) Err() error {
	if h == nil {
		return nil
	}
	type problem struct{ name, reason string }
	var problems, daemon []problem
	h.mu.Lock()
	for what, reason := range h.problems {
		daemon = append(daemon, problem{what, reason})
	}
	for name, st := range h.subscriptions {
		if !st.ok {
			problems = append(problems, problem{name, st.reason})
		}
	}
	h.mu.Unlock()
	byName := func(a, b problem) int { return strings.Compare(a.name, b.name) }
	slices.SortFunc(daemon, byName)
	slices.SortFunc(problems, byName)
	var errs []error
	for _, p := range daemon {
		errs = append(errs, fmt.Errorf("%s: %s", p.name, lineBreaks.Replace(p.reason)))
	}
	for _, p := range problems {
		errs = append(errs, fmt.Errorf("subscription %q: %s", p.name, cmp.Or(lineBreaks.Replace(p.reason), "unhealthy")))
	}
	return errors.Join(errs...)
}
