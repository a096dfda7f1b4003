package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// raiseInTx raises alerts as the reconciler does: in one transaction, so
// each alert's state and its outbox row share their time.
func raiseInTx(t *testing.T, db *pgtest.DB, raise func(alerts.DBTX) error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := raise(tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// statusDoc is the part of `status --json` these tests read.
type statusDoc struct {
	Tools []struct {
		Tool          string `json:"tool"`
		PendingAlerts int    `json:"pending_alerts"`
	} `json:"tools"`
	Alerts struct {
		Pending int `json:"pending"`
	} `json:"alerts"`
	WorkerAlerts []struct {
		Node        string    `json:"node"`
		Reason      string    `json:"reason"`
		FiringSince time.Time `json:"firing_since"`
		Delivery    string    `json:"delivery"`
	} `json:"citus_worker_alerts"`
	WorkerPendingAlerts int `json:"citus_worker_pending_alerts"`
}

func statusJSON(t *testing.T, db *pgtest.DB) statusDoc {
	t.Helper()
	var doc statusDoc
	code, out, stderr := cli(t, "status", "--json", "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("status --json: %d %s %s", code, out, stderr)
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return doc
}

// An unreachable Citus worker's alert (no tool, no key) has a line of its
// own under Alerts, naming the worker, and its pending messages are
// counted apart from the tools' (text and JSON), while the tool's line
// counts its own alerts as before. A worker that answered again has no
// line, though its messages still wait.
func TestStatusShowsEachUnreachableCitusWorkerOnItsOwnLine(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, `INSERT INTO idempotency_keys (key, tool, request_hash, claimed_at, expires_at)
		VALUES ('k-1', 'create_ticket', 'h', now() - interval '1 hour', now() + interval '1 day')`)
	ctx := context.Background()
	raiseInTx(t, db, func(tx alerts.DBTX) error {
		if _, err := alerts.Raise(ctx, tx, alerts.Alert{Reason: alerts.ReasonProbeFailing, Tool: "create_ticket", Key: "k-1"}, time.Hour); err != nil {
			return err
		}
		for _, node := range []string{"127.0.0.1:9702", "10.0.0.9:5432"} {
			if _, err := alerts.RaiseNode(ctx, tx, alerts.NodeAlert{Node: node, Shards: []int64{102008}}, time.Hour); err != nil {
				return err
			}
		}
		return nil
	})
	if _, err := alerts.ResolveNode(ctx, db.Pool, "10.0.0.9:5432", "reachable again"); err != nil {
		t.Fatal(err)
	}

	code, out, stderr := cli(t, "status", "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("status: %d %s %s", code, out, stderr)
	}
	// 1 about the key, 3 about the workers: 10.0.0.9's raise and resolution
	// are pending too.
	for _, re := range []string{
		`(?m)^create_ticket\s+0\s+1\s+\S+\s+0\s+0\s+0\s+1\s`, // TOOL … ALERTS PENDING: the key's alert only
		`(?m)^Alerts: 4 pending`,
		`(?m)^  3 of them about Citus workers \(in no tool's ALERTS PENDING\)$`,
		`(?m)^  Citus worker 127\.0\.0\.1:9702: shards_unreachable firing since \S+, its message pending; .*\(runbook\.md#shards_unreachable\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output does not match %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "Citus worker 10.0.0.9:5432") {
		t.Errorf("status shows a worker that answered again as firing:\n%s", out)
	}

	doc := statusJSON(t, db)
	if len(doc.Tools) != 1 || doc.Tools[0].PendingAlerts != 1 || doc.Alerts.Pending != 4 || doc.WorkerPendingAlerts != 3 {
		t.Errorf("status --json counts: tools %+v, alerts.pending %d, citus_worker_pending_alerts %d; want create_ticket 1, 4, 3",
			doc.Tools, doc.Alerts.Pending, doc.WorkerPendingAlerts)
	}
	if len(doc.WorkerAlerts) != 1 {
		t.Fatalf("status --json citus_worker_alerts: %+v; want 127.0.0.1:9702 only", doc.WorkerAlerts)
	}
	if w := doc.WorkerAlerts[0]; w.Node != "127.0.0.1:9702" || w.Reason != "shards_unreachable" || w.Delivery != "pending" || w.FiringSince.IsZero() {
		t.Errorf("status --json citus_worker_alerts[0] = %+v", w)
	}

	// Delivered: the worker still fires, nothing about it is pending.
	db.Exec(t, `UPDATE alert_outbox SET status = 'sent', sent_at = now(), attempts = 1 WHERE tool IS NULL`)
	_, out, _ = cli(t, "status", "--database-url", db.URL)
	if !strings.Contains(out, "Citus worker 127.0.0.1:9702: shards_unreachable firing since ") ||
		!strings.Contains(out, "its message delivered;") || strings.Contains(out, "about Citus workers") {
		t.Errorf("status of a worker whose message was delivered:\n%s", out)
	}
}

// status lists every firing worker, past one batch of its read, and stops
// at the alerts about tools that follow the workers'.
func TestStatusListsEveryUnreachableCitusWorkerPastOneBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	n := workerBatch + 1
	raiseInTx(t, db, func(tx alerts.DBTX) error {
		for i := range n {
			if _, err := alerts.RaiseNode(ctx, tx, alerts.NodeAlert{Node: fmt.Sprintf("10.0.%d.%d:5432", i/250, i%250), Shards: []int64{int64(102008 + i)}}, time.Hour); err != nil {
				return err
			}
		}
		_, err := alerts.Raise(ctx, tx, alerts.Alert{Reason: alerts.ReasonDownstreamUnreachable, Tool: "create_ticket"}, time.Hour)
		return err
	})
	doc := statusJSON(t, db)
	if len(doc.WorkerAlerts) != n || doc.WorkerPendingAlerts != n || doc.Alerts.Pending != n+1 {
		t.Fatalf("status --json: %d worker alerts, %d pending about workers, %d pending; want %d, %d, %d",
			len(doc.WorkerAlerts), doc.WorkerPendingAlerts, doc.Alerts.Pending, n, n, n+1)
	}
	seen := map[string]bool{}
	for _, w := range doc.WorkerAlerts {
		seen[w.Node] = true
	}
	if len(seen) != n {
		t.Errorf("status --json lists %d distinct workers, want %d", len(seen), n)
	}
}
