package main

import (
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

func TestBracketVariants(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want []string
		ok   bool
	}{
		{"both", []string{bracketOff, bracketOn}, true},
		{"on", []string{bracketOn}, true},
		{"off", []string{bracketOff}, true},
		{"", nil, false},
		{"true", nil, false},
	} {
		got, err := bracketVariants(tc.flag)
		if (err == nil) != tc.ok || len(got) != len(tc.want) {
			t.Fatalf("bracketVariants(%q) = %v, %v; want %v", tc.flag, got, err, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("bracketVariants(%q) = %v; want %v", tc.flag, got, tc.want)
			}
		}
	}
}

func TestCheckDownstreamCountsChecksApart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seen    downstreamHits
		variant string
		ok      bool
	}{
		{"off, keys only", downstreamHits{Keys: 10}, bracketOff, true},
		{"off, a made-up key", downstreamHits{Keys: 10, MadeUp: 1, Witnesses: witnessKeys}, bracketOff, false},
		{"a key missed", downstreamHits{Keys: 9}, bracketOff, false},
		{"on, opener and closer", downstreamHits{Keys: 10, MadeUp: 2, Witnesses: 2 * witnessKeys}, bracketOn, true},
		{"on, opener only", downstreamHits{Keys: 10, MadeUp: 1, Witnesses: witnessKeys}, bracketOn, false},
		{"on, a witness not probed", downstreamHits{Keys: 10, MadeUp: 3, Witnesses: 3*witnessKeys - 1}, bracketOn, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkDownstream(tc.seen, 10, tc.variant); (err == nil) != tc.ok {
				t.Fatalf("checkDownstream(%+v, 10, %s) = %v; want ok %v", tc.seen, tc.variant, err, tc.ok)
			}
		})
	}
}

func TestCheckPassRefusesWithheldVerdicts(t *testing.T) {
	rep := reconcile.Report{Decided: 9, Withheld: 1, Actions: map[string]int{
		reconcile.ActionCompleted: 5, reconcile.ActionMarkedRetryable: 4, reconcile.ActionWithheldUnwitnessed: 1}}
	if err := checkPass(rep, 10, bracketOff); err == nil {
		t.Fatal("checkPass accepted a pass with a withheld verdict")
	}
	rep = reconcile.Report{Decided: 10, Actions: map[string]int{reconcile.ActionCompleted: 5, reconcile.ActionMarkedRetryable: 5}}
	if err := checkPass(rep, 10, bracketOff); err != nil {
		t.Fatalf("checkPass refused a complete pass: %v", err)
	}
	if err := checkPass(rep, 10, bracketOn); err == nil {
		t.Fatal("checkPass accepted a bracketed pass with no self-check in its report")
	}
}
