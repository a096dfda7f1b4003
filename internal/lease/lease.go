// Package lease makes the tokens ledgerkeeper's leases are held by: the
// lease_owner of a reconcile_state row (reconcile) and of an alert_outbox
// row (alerts).
//
// A token is unique per claim, not per process: every write that ends a
// lease is conditional on the holder's token, so a run whose lease was taken
// over (it expired while the run was slow, and another run claimed the row)
// finds its token gone and writes nothing.
package lease

import (
	"crypto/rand"
	"encoding/hex"
)

// Token returns actor + "/" + 12 random hex digits (48 bits from
// crypto/rand), e.g. "host-1:4242/3f9c0a1b2d4e". actor says who holds the
// lease, for an operator reading the row; the random part makes two claims
// by the same actor differ.
func Token(actor string) string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return actor + "/" + hex.EncodeToString(b[:])
}
