package reconcile

import "time"

// ProbePauses returns the tools whose probing a downstream has paused in
// this process (it answered 429 or 503 with Retry-After), each with when
// the pause ends. A pause is kept by the engine only: another replica's is
// not seen, and it is gone when the process ends. The map is the caller's.
func (e *Engine) ProbePauses() map[string]time.Time {
	out := map[string]time.Time{}
	now := time.Now()
	for tool, l := range e.limits {
		l.mu.Lock()
		until := l.until
		l.mu.Unlock()
		if until.After(now) {
			out[tool] = until.Round(0) // the wall clock's reading, for display
		}
	}
	return out
}
