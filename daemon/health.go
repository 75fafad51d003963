package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/streamd/streamd/metrics"
)

// subHealth is the health of a running file subscription, which two
// things can keep from its work: the file at its stream's path, which its
// follower cannot read (tailObserver.Trouble), and its copies, which cannot
// be written (subscription.finish). Each keeps its own reason, so that the
// end of one does not hide the other: the subscription is healthy while
// neither has one. The follower's goroutine and the workers set it
// concurrently.
type subHealth struct {
	m            *metrics.SubscriptionMetrics
	mu           sync.Mutex
	file, copies string // why it cannot work, "" while it can
}

// setFile sets why the file at the stream's path cannot be read, "" once
// it can.
func (h *subHealth) setFile(reason string) { h.set(&h.file, reason) }

// setCopies sets why the copies cannot be written, "" once they can.
func (h *subHealth) setCopies(reason string) { h.set(&h.copies, reason) }

// set sets one of h's reasons, and the subscription's health from both.
func (h *subHealth) set(field *string, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	*field = reason
	h.m.SetHealthy(h.file == "" && h.copies == "", joinNote(h.file, h.copies))
}

// waitingReason is the health reason of a subscription that waits for its
// stream file, which cannot be read (err, naming the stream), tried again
// every poll: at start, before it runs (launch), and while it runs
// (tailObserver.Trouble).
func waitingReason(poll time.Duration, err error) string {
	return fmt.Sprintf("waiting for its stream file, tried again every %s: %v", poll, err)
}
