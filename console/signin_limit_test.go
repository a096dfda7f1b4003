package console

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Guessing passwords is bounded per client address: after 20 failures in
// a minute, sign-ins from it are answered 429 with Retry-After and no
// password is compared, even a right one, until the minute ends; a user
// already signed in keeps working meanwhile; at most two comparisons run
// at once whatever the number of guesses in flight.
func TestFailedSignInsAreLimitedPerAddress(t *testing.T) {
	r := newRig(t)
	b := r.h.auth.(*basicAuth)
	var mu sync.Mutex
	now := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	b.limit.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	wantStatus(t, r.get(t, "alice", "/ui/keys"), http.StatusOK)

	wrong := func() response {
		return r.do(t, "", http.MethodGet, "/ui/keys", nil, map[string]string{"Authorization": basic("bob", "not-bobs-password")})
	}
	for range signInFailures {
		wantStatus(t, wrong(), http.StatusUnauthorized)
	}
	limited := wrong()
	wantStatus(t, limited, http.StatusTooManyRequests)
	if got := limited.Header.Get("Retry-After"); got != "60" {
		t.Errorf("Retry-After %q, want 60", got)
	}
	// bob's right password is not even compared now.
	wantStatus(t, r.get(t, "bob", "/ui/keys"), http.StatusTooManyRequests)
	// alice, checked before, is not held up.
	wantStatus(t, r.get(t, "alice", "/ui/keys"), http.StatusOK)

	mu.Lock()
	now = now.Add(signInWindow)
	mu.Unlock()
	wantStatus(t, r.get(t, "bob", "/ui/keys"), http.StatusOK)

	// With signInChecks comparisons running, another waits for a slot: a
	// request that ends meanwhile is answered without one.
	gate := make(chan struct{})
	var running sync.WaitGroup
	running.Add(signInChecks)
	var done sync.WaitGroup
	for range signInChecks {
		done.Go(func() { b.limit.check(t.Context(), func() { running.Done(); <-gate }) })
	}
	running.Wait()
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	for range 20 {
		if b.limit.check(ended, func() { t.Error("a third comparison ran while two were running") }) {
			t.Fatal("check reported a comparison with every slot taken")
		}
	}
	close(gate)
	done.Wait()
}

func basic(user, pass string) string {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, pass)
	return req.Header.Get("Authorization")
}
