package main

import (
	"strings"
	"testing"
)

// A variant's name says its pools and their settings; a name that says
// something else, or nothing it can mean, is refused naming the part.
func TestFleetVariantNamesSayTheirPools(t *testing.T) {
	for _, tc := range []struct {
		name string
		want fleetConfig
	}{
		{"single", fleetConfig{single: true}},
		{"fleet", fleetConfig{perLedger: true}},
		{"fleet/ledger:4", fleetConfig{perLedger: true, conns: 4}},
		{"fleet/db:72", fleetConfig{conns: 72}},
		{"fleet+generic", fleetConfig{perLedger: true, generic: true}},
		{"single/db:8+generic+describe", fleetConfig{single: true, conns: 8, generic: true, describe: true}},
		{"fleet+describe/ledger:2", fleetConfig{perLedger: true, conns: 2, describe: true}},
	} {
		got, err := parseFleetVariant(tc.name)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		tc.want.name = tc.name
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct{ name, says string }{
		{"", "single or fleet"},
		{"fleets", "single or fleet"},
		{"fleet+hung", `"+hung"`},
		{"single/ledger:4", "one pool"},
		{"fleet/ledger:0", "/ledger:0"},
		{"fleet/db:x", "/db:x"},
		{"fleet/ledger:99999999999", "/ledger:99999999999"},
		{"fleet/pool:4", `"/pool:4"`},
	} {
		_, err := parseFleetVariant(tc.name)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: got error %v, want one saying %s", tc.name, err, tc.says)
		}
	}
}
