package store

import (
	"context"
	"reflect"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// store reads whole keys as ledger does, ledger.KeyColumns by name: a key
// with every column set reads the same through the store's read for update
// as through ledger.Get.
func TestStoreReadsEveryColumnOfAKeyAsLedgerDoes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, request_body, status, response_code, response_body,
			created_at, claimed_at, updated_at, expires_at, heartbeat_at)
		VALUES ('k', 'create_ticket', 'h', '{"a":1}', 'completed', 201, '{"id":7}',
			now() - interval '5 minutes', now() - interval '4 minutes', now() - interval '3 minutes',
			now() + interval '1 day', now() - interval '2 minutes')`)
	want, err := ledger.Get(ctx, db.Pool, "k")
	if err != nil {
		t.Fatal(err)
	}
	got, err := getForUpdate(ctx, db.Pool, "k")
	if err != nil {
		t.Fatal(err)
	}
	if want.ResponseCode == nil || want.HeartbeatAt == nil || len(want.RequestBody) == 0 || len(want.ResponseBody) == 0 {
		t.Fatalf("fixture leaves a column empty: %+v", want)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("store read\n%+v\nledger read\n%+v", got, want)
	}
}
