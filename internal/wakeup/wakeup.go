// Package wakeup wakes every goroutine waiting for a change that another
// goroutine makes under a lock, with a channel a waiter can select on
// together with its context: what sync.Cond cannot do.
package wakeup

// Signal is a one-shot broadcast renewed after each wake-up. The zero value
// is ready to use. Its methods must be called with the lock that guards
// the change held.
type Signal struct{ ch chan struct{} }

// C returns a channel that is closed at the next call to Wake. A waiter
// takes it, releases the lock and waits on it, then takes the lock again
// and looks at the state.
func (s *Signal) C() <-chan struct{} {
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Wake closes the channel of the waiters, if any.
func (s *Signal) Wake() {
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
