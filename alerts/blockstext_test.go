package alerts

import (
	"strings"
	"testing"
)

// BlocksText reads back what a message posts: header, sections with the
// per-key commands, entities decoded; not the plain fallback.
func TestBlocksTextShowsTheBlocks(t *testing.T) {
	items := fixtureItems()
	for i := range items {
		items[i].reason, items[i].kind = ReasonProbeFailing, KindFiring
	}
	m := newRenderer(testRunbook, 20).render(KindFiring, ReasonProbeFailing, items, fixtureNow)
	got := MessageText(m)
	for _, want := range []string{"🔴 Probe failing: 3 keys\n\n*What it means:*", "*Next:* ```ledgerkeeper reconcile --key=wf-8812:step-3:create_ticket```", "order 77 <retry>"} {
		if !strings.Contains(got, want) {
			t.Errorf("text lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "[FIRING]") {
		t.Errorf("the fallback, not the blocks:\n%s", got)
	}
	if _, err := BlocksText([]byte("not json")); err == nil {
		t.Error("garbage blocks read without error")
	}
}
