package uipath

import "testing"

func TestPathsCarryTheLedgersPrefixAndEscapeTheirValues(t *testing.T) {
	for got, want := range map[string]string{
		Base(""):                    "/ui/",
		Base("billing"):             "/ui/ledgers/billing/",
		Key("", "k-1"):              "/ui/key?key=k-1",
		Key("billing", "a&b c#d"):   "/ui/ledgers/billing/key?key=a%26b+c%23d",
		Checks("", "create_ticket"): "/ui/checks#tool-create_ticket",
		Checks("support", "a/b c"):  "/ui/ledgers/support/checks#tool-a%2Fb%20c",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}
