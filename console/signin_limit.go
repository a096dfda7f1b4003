package console

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// What failed sign-ins may cost. A bcrypt comparison takes tens of
// milliseconds of CPU by design, and serve shares its CPU with the
// reconciler: a client guessing passwords must not be able to spend it.
const (
	// signInFailures is how many failed sign-ins one client address may
	// make per signInWindow; past it, sign-ins from that address are
	// answered 429 without a comparison until the window ends.
	signInFailures = 20
	signInWindow   = time.Minute
	// signInChecks bounds the bcrypt comparisons running at once.
	signInChecks = 2
)

// signInLimit counts failed sign-ins per client address in fixed windows
// and bounds concurrent password checks. A user whose credentials were
// already checked (basicAuth's cache) is never limited: only new checks
// are.
type signInLimit struct {
	now    func() time.Time
	slots  chan struct{}
	mu     sync.Mutex
	failed map[netip.Addr]*signInFailuresOf
}

type signInFailuresOf struct {
	since time.Time
	n     int
}

func newSignInLimit() *signInLimit {
	return &signInLimit{now: time.Now, slots: make(chan struct{}, signInChecks), failed: map[netip.Addr]*signInFailuresOf{}}
}

// client is the request's peer address (the zero Addr when unreadable:
// counted together).
func client(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, _ := netip.ParseAddr(host)
	return addr.Unmap()
}

// blocked reports whether addr has used up its failures in this window.
func (l *signInLimit) blocked(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.failed[addr]
	return f != nil && l.now().Sub(f.since) < signInWindow && f.n >= signInFailures
}

// fail counts a failed sign-in from addr.
func (l *signInLimit) fail(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	f := l.failed[addr]
	if f == nil || now.Sub(f.since) >= signInWindow {
		if len(l.failed) > 10000 {
			clear(l.failed) // bounded memory; an attacker gains a fresh window at most
		}
		f = &signInFailuresOf{since: now}
		l.failed[addr] = f
	}
	f.n++
}

// check runs one password comparison when a slot is free, or reports
// false when ctx ends first.
func (l *signInLimit) check(ctx context.Context, compare func()) bool {
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-l.slots }()
	compare()
	return true
}
