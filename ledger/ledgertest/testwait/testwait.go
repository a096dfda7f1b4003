// Package testwait is how tests wait: every channel receive, WaitGroup wait
// and poll gets a deadline, so a regression fails the test in seconds with
// the line that waited, instead of hanging the whole package until go
// test's -timeout kills it with a goroutine dump.
//
// Call these from the test's own goroutine (they call t.Fatalf). A poll is
// a loop with a deadline, not a sleep standing in for synchronisation.
package testwait

import (
	"sync"
	"testing"
	"time"
)

// Timeout is a generous bound for one wait that should end at once when the
// code is right: far beyond any healthy run on a loaded CI machine, short
// enough that a hang is reported quickly.
const Timeout = 10 * time.Second

// Recv receives one value from ch, or fails the test when none arrives
// within timeout. A closed channel yields its zero value, so Recv also
// waits for a done channel to close.
func Recv[T any](t testing.TB, ch <-chan T, timeout time.Duration) T {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("testwait: nothing received on the channel within %s", timeout)
	}
	var zero T
	return zero
}

// Wait waits for wg, or fails the test when it is not done within timeout.
// On failure the goroutine waiting on wg is left behind: the test has
// failed, and the goroutines it waited for are stuck anyway.
func Wait(t testing.TB, wg *sync.WaitGroup, timeout time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("testwait: WaitGroup not done within %s", timeout)
	}
}

// Eventually polls cond until it returns true, or fails the test after
// timeout, saying what it was waiting for ("the purge batch to block on the
// locked row"). cond runs on the test's goroutine and may itself fail the
// test. Polls start at 1ms apart and back off to 50ms.
func Eventually(t testing.TB, cond func() bool, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testwait: still waiting for %s after %s", what, timeout)
			return
		}
		time.Sleep(interval) // polling interval, not synchronisation
		interval = min(2*interval, 50*time.Millisecond)
	}
}
