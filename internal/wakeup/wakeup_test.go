package wakeup

import (
	"sync"
	"testing"
	"testing/synctest"
)

func TestSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var s Signal
		changed := false
		woke := make(chan bool, 2)
		for range 2 {
			go func() {
				mu.Lock()
				c := s.C()
				mu.Unlock()
				<-c
				mu.Lock()
				woke <- changed
				mu.Unlock()
			}()
		}
		synctest.Wait() // both wait
		if len(woke) != 0 {
			t.Fatal("a waiter returned before the wake-up")
		}
		mu.Lock()
		changed = true
		s.Wake()
		s.Wake() // a second wake-up with no waiter does nothing
		mu.Unlock()
		for range 2 {
			if !<-woke {
				t.Error("a waiter woke without seeing the change")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-s.C():
			t.Error("the channel after a wake-up is closed already")
		default:
		}
	})
}
