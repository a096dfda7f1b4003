package testwait_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// recorder is a testing.TB whose Fatalf records the failure and ends the
// calling goroutine, as the real one does.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// fails runs f against a recorder on a goroutine of its own (Fatalf ends
// it) and returns the failure message, "" if f passed.
func fails(t *testing.T, f func(tb testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	select {
	case <-done:
	case <-time.After(testwait.Timeout):
		t.Fatal("testwait itself did not return")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func TestRecv(t *testing.T) {
	t.Parallel()
	ch := make(chan int, 1)
	ch <- 7
	if got := testwait.Recv(t, ch, time.Second); got != 7 {
		t.Fatalf("Recv = %d, want 7", got)
	}
	done := make(chan struct{})
	close(done)
	testwait.Recv(t, done, time.Second) // a closed channel is received at once

	msg := fails(t, func(tb testing.TB) { testwait.Recv(tb, make(chan int), 20*time.Millisecond) })
	if !strings.Contains(msg, "nothing received") || !strings.Contains(msg, "20ms") {
		t.Fatalf("Recv on a silent channel failed with %q", msg)
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	wg.Go(func() {})
	testwait.Wait(t, &wg, time.Second)

	var stuck sync.WaitGroup
	stuck.Add(1)
	defer stuck.Done()
	if msg := fails(t, func(tb testing.TB) { testwait.Wait(tb, &stuck, 20*time.Millisecond) }); !strings.Contains(msg, "not done within 20ms") {
		t.Fatalf("Wait on a stuck group failed with %q", msg)
	}
}

func TestEventually(t *testing.T) {
	t.Parallel()
	n := 0
	testwait.Eventually(t, func() bool { n++; return n == 3 }, time.Second, "the third poll")
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	msg := fails(t, func(tb testing.TB) {
		testwait.Eventually(tb, func() bool { return false }, 20*time.Millisecond, "a condition that never holds")
	})
	if !strings.Contains(msg, "still waiting for a condition that never holds after 20ms") {
		t.Fatalf("Eventually failed with %q", msg)
	}
}
