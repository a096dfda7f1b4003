package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// failoverWait bounds how long an operator's act waits for the ledger's
// database to take writes again (a planned switchover takes seconds; a
// primary that died, about a minute to be replaced): the person acting is
// told "done" or "not done" within it, never "error" for an act that
// committed.
var failoverWait = 90 * time.Second

// inTx runs fn, an operator's act on key, in one transaction through a
// failover of the ledger's database. A write whose connection no longer
// reaches a writable primary (ledger.FailoverReason) wrote nothing and is
// run again on a fresh connection. A COMMIT that was sent but not answered
// has an unknown outcome: the key's audit rows at the transaction's own
// now() tell (store.AuditedAt, read on another connection): present, the
// act committed and inTx returns nil, fn's results those of the run that
// committed; absent, fn runs again (its checks, under the row lock, see
// the key as it is now). commit is tx.Commit; tests replace it.
func inTx(ctx context.Context, db store.Beginner, key string, commit func(pgx.Tx, context.Context) error, fn func(tx pgx.Tx) error) error {
	deadline := time.Now().Add(failoverWait)
	for n := 0; ; n++ {
		at, atCommit, err := store.TxAt(ctx, db, commit, fn)
		if err == nil {
			return nil
		}
		if _, failover := ledger.FailoverReason(err); !failover {
			return err
		}
		if atCommit {
			audited, rerr := store.AwaitAuditedAt(ctx, db, []string{key}, at, deadline)
			_, committed := audited[key]
			if rerr != nil {
				return fmt.Errorf("the database failed over under the commit and whether it went through is unknown (see 'ledgerkeeper inspect %s'): %w", key, rerr)
			}
			if committed {
				return nil
			}
		}
		if !store.FailoverBackoff(ctx, n, deadline) {
			return fmt.Errorf("not done: the database did not take writes again within %s (it is failing over): %w", failoverWait, err)
		}
	}
}
