package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/expiry"
)

// A purge that kept held processing keys says to release them before
// resolving: resolve refuses a held key.
func TestPurgeSaysReleaseAHeldKeyFirst(t *testing.T) {
	var out bytes.Buffer
	printPurge(&out, expiry.Report{ExpiredProcessing: 2, ExpiredProcessingHeld: 1, AlertsRaised: 1})
	if !strings.Contains(out.String(), "released first ('ledgerkeeper release KEY')") {
		t.Fatalf("held key without the release step:\n%s", out.String())
	}
	out.Reset()
	printPurge(&out, expiry.Report{ExpiredProcessing: 2, AlertsRaised: 2})
	if strings.Contains(out.String(), "release") {
		t.Fatalf("no held key, yet release is suggested:\n%s", out.String())
	}
}
