// Package uipath builds the paths of the web console's pages, for links
// from outside the console (Slack's messages) by code that cannot import
// package console (which imports alerts). The console builds its own from
// the same functions, so a link and the page it names cannot drift apart.
//
// A path is put after console.public_url; every value in it is escaped.
package uipath

import "net/url"

// Root is where the console lives on a listener.
const Root = "/ui/"

// Base is where ledger's pages are: Root for the one ledger of a
// configuration without a ledgers section (ledger ""), Root + "ledgers/" +
// ledger + "/" for a ledger of a fleet. A ledger's name is lower-case
// letters, digits, '-' and '_' (the configuration's rule), written as it
// is.
func Base(ledger string) string {
	if ledger == "" {
		return Root
	}
	return Root + "ledgers/" + ledger + "/"
}

// Key is key's page in ledger's console ("": the one ledger's).
func Key(ledger, key string) string { return Base(ledger) + "key?key=" + url.QueryEscape(key) }

// Checks is tool's section of the self-checks page of ledger's console
// ("": the one ledger's).
func Checks(ledger, tool string) string { return Base(ledger) + "checks#tool-" + url.PathEscape(tool) }
