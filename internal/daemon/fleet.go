package daemon

import (
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// LedgerTarget is one ledger of a serve process that keeps several: what
// the process-wide parts (Slack actions, the console) need to act on it.
type LedgerTarget struct {
	// Name is the ledger's name (config.Ledger.Name).
	Name string
	// Config is the ledger's own configuration (the top level's with the
	// ledger's settings over it).
	Config *config.Config
	// Pool is the ledger's database, its statements qualified with the
	// ledger's schema.
	Pool store.Pool
	// Windows are the ledger's tools' processing windows (its engine's).
	Windows operator.Windows
}
