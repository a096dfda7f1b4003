package daemon

import (
	"strings"
	"testing"
)

// reconcile is a console action an operator may be granted; an unknown
// action's error lists it among the known ones.
func TestConsoleOperatorsMayBeGrantedReconcile(t *testing.T) {
	t.Parallel()
	if _, err := settle(t, "console:\n  operators: {alice: [reconcile], bob: [hold, reconcile]}\n", envOf(nil)); err != nil {
		t.Fatalf("reconcile granted: %v", err)
	}
	_, err := settle(t, "console:\n  operators: {bob: [rerun]}\n", envOf(nil))
	if err == nil || !strings.Contains(err.Error(), `console.operators.bob[0]: unknown action "rerun" (want hold, release, mark_retryable, store_outcome or reconcile;`) {
		t.Errorf("an unknown action: %v", err)
	}
}
