package reconcile

import "encoding/json"

// MismatchedFields names the top-level response_body members whose value
// in got (a found probe's outcome) differs from stored (the outcome in the
// ledger), by the self-check's rule: members only one side has are not
// compared, numbers compare by value. `ledgerkeeper probe run` uses it to
// show, for a completed key, whether the probe reads back what its tool
// server stored. Nil when either side is not a JSON object.
func MismatchedFields(stored, got json.RawMessage) []string {
	return mismatchedFields(stored, got)
}
