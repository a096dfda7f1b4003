package reconcile

import "testing"

// A writer's group tells the breaker its verdicts in the order of its plans:
// a conclusive verdict restarts the count, so only the unknowns after the
// last conclusive one are added.
func TestVerdictCountAddsOnlyUnknownsAfterTheLastConclusive(t *testing.T) {
	t.Parallel()
	type v struct {
		conclusive bool
		err        string
	}
	u := func(err string) v { return v{err: err} }
	c := v{conclusive: true}
	for _, tc := range []struct {
		name           string
		verdicts       []v
		wantConclusive bool
		wantUnknowns   int
		wantLastErr    string
	}{
		{"nothing", nil, false, 0, ""},
		{"one unknown", []v{u("e1")}, false, 1, "e1"},
		{"unknowns only", []v{u("e1"), u("e2"), u("e3")}, false, 3, "e3"},
		{"one conclusive", []v{c}, true, 0, ""},
		{"unknowns then conclusive", []v{u("e1"), u("e2"), c}, true, 0, ""},
		{"conclusive then unknowns", []v{c, u("e1"), u("e2")}, true, 2, "e2"},
		{"unknown, conclusive, unknown", []v{u("e1"), c, u("e2")}, true, 1, "e2"},
		{"two conclusive, unknowns between", []v{c, u("e1"), u("e2"), c, u("e3")}, true, 1, "e3"},
		{"ends conclusive", []v{u("e1"), c, u("e2"), c}, true, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vc := verdictCount{tool: "tickets"}
			for _, x := range tc.verdicts {
				vc.add(x.conclusive, x.err)
			}
			if vc.conclusive != tc.wantConclusive || vc.unknowns != tc.wantUnknowns || vc.lastErr != tc.wantLastErr {
				t.Fatalf("got conclusive=%v unknowns=%d lastErr=%q; want %v, %d, %q",
					vc.conclusive, vc.unknowns, vc.lastErr, tc.wantConclusive, tc.wantUnknowns, tc.wantLastErr)
			}
		})
	}
}
