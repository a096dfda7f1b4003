package alerts

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
)

// Alerts about a Citus worker (shards_unreachable): one per worker, not per
// key, since a worker that cannot be reached hides every key on its shards.
// Their alert_state and alert_outbox rows have no tool and no key (NULL);
// the subject is node:HOST:PORT and the outbox row carries the worker in
// details.node, by which the dispatcher keeps each worker's notices apart
// and gives each worker a message of its own.

// NodeAlert describes a Citus worker whose shards cannot be reached.
type NodeAlert struct {
	// Node is the worker's "host:port", from the coordinator's metadata
	// (pg_dist_node). It must be set, and at most maxNodeLen characters.
	Node string
	// Shards are the shard ids of idempotency_keys on Node that could not
	// be reached. Stored sorted without repeats, at most maxStoredShards
	// of them (the message counts the rest).
	Shards []int64
	// Error is the error Citus gave, already free of secrets; clipped like
	// Details.LastError.
	Error string
}

const (
	// nodeSubjectPrefix starts the alert_state subject of a worker's alert.
	nodeSubjectPrefix = "node:"
	// maxNodeLen is the longest worker name an alert can be about:
	// alert_state.subject is varchar(200), "node:" included.
	maxNodeLen = 200 - len(nodeSubjectPrefix)
	// maxStoredShards bounds the shard ids an outbox row keeps (Citus
	// allows 64,000 shards per table); a message lists fewer still.
	maxStoredShards = 1000
)

// nodeSubject is the alert_state subject of node's alert, and node as
// stored (made valid UTF-8, as every stored text is).
func nodeSubject(node string) (subj, stored string, err error) {
	if node == "" {
		panic("alerts: a Citus worker alert needs the worker's host:port")
	}
	stored = safetext.Clean(node)
	if n := utf8.RuneCountInString(stored); n > maxNodeLen {
		return "", "", fmt.Errorf("alert about Citus worker %q: its name has %d characters, more than the %d alert_state can hold",
			safetext.ClipRunes(stored, 60), n, maxNodeLen)
	}
	return nodeSubjectPrefix + stored, stored, nil
}

// RaiseNode records a firing shards_unreachable alert for a.Node (subject
// node:HOST:PORT, tool and key NULL) and enqueues it, unless an alert for
// that worker is open and was raised less than renotifyAfter ago: then it
// returns false, nil. The same rules as Raise: call it in the transaction
// of what found the worker unreachable; it is raised again (re-notified)
// after renotifyAfter while the worker stays unreachable, and at once after
// ResolveNode. A name longer than maxNodeLen characters is an error.
func RaiseNode(ctx context.Context, db DBTX, a NodeAlert, renotifyAfter time.Duration) (bool, error) {
	subj, node, err := nodeSubject(a.Node)
	if err != nil {
		return false, err
	}
	shards := slices.Clone(a.Shards)
	slices.Sort(shards)
	shards = slices.Compact(shards)
	d := Details{Node: node, ShardCount: len(shards), Shards: shards[:min(len(shards), maxStoredShards)], LastError: a.Error}
	return raise(ctx, db, subj, Alert{Reason: ReasonShardsUnreachable, Details: d}, renotifyAfter)
}

// ResolveNode resolves the open shards_unreachable alert of node (how:
// "reachable again", "removed from the cluster") and enqueues one resolved
// notice for it, like ResolveKey. It returns how many alerts it resolved:
// 0 when none was open.
func ResolveNode(ctx context.Context, db DBTX, node, how string) (int, error) {
	subj, stored, err := nodeSubject(node)
	if err != nil {
		return 0, err
	}
	return resolveReason(ctx, db, subj, string(ReasonShardsUnreachable), Alert{Details: Details{Node: stored}}, how)
}

// OpenNodeAlerts lists the workers ("host:port", as given to RaiseNode)
// with an open shards_unreachable alert, sorted: the caller resolves those
// it finds reachable again with ResolveNode.
func OpenNodeAlerts(ctx context.Context, db DBTX) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	// Served by alert_state_open_idx; no limit: one row per worker of the
	// cluster at most. starts_with, unlike a range on subject, holds
	// whatever the database's collation.
	rows, err := db.Query(ctx, `SELECT subject FROM alert_state
		WHERE resolved_at IS NULL AND reason = $1 AND starts_with(subject, $2)`,
		string(ReasonShardsUnreachable), nodeSubjectPrefix)
	if err != nil {
		return nil, fmt.Errorf("list open Citus worker alerts: %w", err)
	}
	subjects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list open Citus worker alerts: %w", err)
	}
	nodes := make([]string, 0, len(subjects))
	for _, s := range subjects {
		nodes = append(nodes, strings.TrimPrefix(s, nodeSubjectPrefix))
	}
	// Sorted here, byte by byte: the database's collation may order
	// punctuation otherwise.
	slices.Sort(nodes)
	return nodes, nil
}
