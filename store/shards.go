package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// On Citus, a statement that reads across the shards of idempotency_keys
// fails as a whole when one worker cannot be reached ("connection to the
// remote node ... failed"). The reconciler's and the purge's reads that
// find work (the tools with processing keys, the due keys, the self-check's
// samples, the expired keys) then run again shard by shard, each shard on
// a connection of its own from the coordinator: the shards that answer are
// worked on, and the others are reported in a *ShardsUnreachableError
// returned with the partial result. What follows the read names its keys
// (key = ANY(...)), so Citus routes it to the shards that answered.
//
// The per-shard statements are built on the coordinator by format(): the
// shard tables' names come from Citus's metadata through shard_name()
// (quoted as identifiers), the values through %L (quoted as literals).
// Nothing from Go is spliced into SQL text.

// ShardFault is a shard of the ledger that could not be reached.
type ShardFault struct {
	// Shard is the shard id of idempotency_keys (its co-located tables'
	// shards are on the same worker).
	Shard int64 `json:"shard"`
	// Node is the worker holding it, host:port as in pg_dist_node.
	Node string `json:"node"`
	// Err is what the coordinator got trying (no secrets: Citus's own
	// message, which names the node).
	Err string `json:"error"`
}

// ShardsUnreachableError comes with a partial result: the shards in Faults
// could not be read, the others were. Keys on those shards are left as
// they are (processing, unexpired, unpurged) until their worker is back.
type ShardsUnreachableError struct {
	Op     string
	Faults []ShardFault
}

func (e *ShardsUnreachableError) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	b.WriteString(": ")
	for i, n := range e.Nodes() {
		if i > 0 {
			b.WriteString("; ")
		}
		shards := e.ShardsOn(n)
		ids := make([]string, len(shards))
		for j, s := range shards {
			ids[j] = strconv.FormatInt(s, 10)
		}
		fmt.Fprintf(&b, "shard %s on Citus worker %s unreachable", strings.Join(ids, ", "), n)
	}
	b.WriteString(" (their keys wait for it)")
	return b.String()
}

// Nodes lists the unreachable workers, sorted.
func (e *ShardsUnreachableError) Nodes() []string {
	var out []string
	for _, f := range e.Faults {
		if !slices.Contains(out, f.Node) {
			out = append(out, f.Node)
		}
	}
	sort.Strings(out)
	return out
}

// ShardsOn lists the unreachable shards on node, sorted.
func (e *ShardsUnreachableError) ShardsOn(node string) []int64 {
	var out []int64
	for _, f := range e.Faults {
		if f.Node == node {
			out = append(out, f.Shard)
		}
	}
	slices.Sort(out)
	return out
}

// NodeError returns the first error reported for node.
func (e *ShardsUnreachableError) NodeError(node string) string {
	for _, f := range e.Faults {
		if f.Node == node {
			return f.Err
		}
	}
	return ""
}

// AsShardsUnreachable returns err's *ShardsUnreachableError, if it is one.
func AsShardsUnreachable(err error) (*ShardsUnreachableError, bool) {
	var e *ShardsUnreachableError
	ok := errors.As(err, &e)
	return e, ok
}

// NodeUnreachable reports whether err is a Citus coordinator relaying that
// it could not reach a worker: a connection error (SQLSTATE class 08), or
// the worker's shutdown or start-up (57P01-57P03), sent as an ordinary
// ERROR. The coordinator's own connection going away is not
// one (pgx reports no PgError then, or a FATAL one).
func NodeUnreachable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	if pgErr.Severity == "ERROR" && (strings.HasPrefix(pgErr.Code, "08") ||
		// A worker shutting down under the statement, or starting up.
		pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03") {
		return true
	}
	return strings.HasPrefix(pgErr.Message, "connection to the remote node")
}

// shardwiseSQL runs the per-shard command template $1 on every shard of
// idempotency_keys, each on its own connection from the coordinator to the
// shard's worker, in parallel (Citus's master_run_on_worker, which reports
// a failure per command instead of failing the statement). The template's
// %1$s to %4$s are the shard's tables (idempotency_keys, reconcile_state,
// key_holds, reconcile_audit: co-located, so on one worker), %5$L onwards
// the values of $2, quoted as literals. The command must return one value.
const shardwiseSQL = `
WITH shards AS (
	SELECT s.shardid, n.nodename, n.nodeport,
	       format($1::text, VARIADIC ARRAY[
	           shard_name('idempotency_keys'::regclass, s.shardid),
	           shard_name('reconcile_state'::regclass, r.shardid),
	           shard_name('key_holds'::regclass, h.shardid),
	           shard_name('reconcile_audit'::regclass, a.shardid)]::text[] || $2::text[]) AS command
	FROM pg_dist_shard s
	JOIN pg_dist_shard r ON r.logicalrelid = 'reconcile_state'::regclass AND r.shardminvalue = s.shardminvalue
	JOIN pg_dist_shard h ON h.logicalrelid = 'key_holds'::regclass AND h.shardminvalue = s.shardminvalue
	JOIN pg_dist_shard a ON a.logicalrelid = 'reconcile_audit'::regclass AND a.shardminvalue = s.shardminvalue
	JOIN pg_dist_placement p ON p.shardid = s.shardid
	JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
	WHERE s.logicalrelid = 'idempotency_keys'::regclass
), batch AS (
	SELECT array_agg(shardid ORDER BY shardid) AS ids, array_agg(nodename::text ORDER BY shardid) AS names,
	       array_agg(nodeport ORDER BY shardid) AS ports, array_agg(command ORDER BY shardid) AS commands
	FROM shards
)
SELECT b.ids[r.n], b.names[r.n] || ':' || b.ports[r.n], r.success, r.result
FROM batch b, LATERAL master_run_on_worker(b.names, b.ports, b.commands, true)
     WITH ORDINALITY AS r(node_name, node_port, success, result, n)
ORDER BY 1`

// shardwise runs the read template (see shardwiseSQL) on every shard and
// decodes each answering shard's JSON array into rows of T. Shards that did
// not answer are returned as faults; an error of the statement itself (the
// coordinator's) is returned as an error.
func shardwise[T any](ctx context.Context, db ledger.DBTX, template string, args ...*string) ([]T, []ShardFault, error) {
	if args == nil {
		args = []*string{}
	}
	rows, err := db.Query(ctx, shardwiseSQL, template, args)
	if err != nil {
		return nil, nil, err
	}
	var (
		out    []T
		faults []ShardFault
		shard  int64
		node   string
		ok     bool
		result string
	)
	_, err = pgx.ForEachRow(rows, []any{&shard, &node, &ok, &result}, func() error {
		if !ok {
			faults = append(faults, ShardFault{Shard: shard, Node: node, Err: result})
			return nil
		}
		var part []T
		if err := json.Unmarshal([]byte(result), &part); err != nil {
			return fmt.Errorf("read shard %d's answer: %w", shard, err)
		}
		out = append(out, part...)
		return nil
	})
	return out, faults, err
}

// partial returns the error for a result read shard by shard: nil when
// every shard answered.
func partial(op string, faults []ShardFault) error {
	if len(faults) == 0 {
		return nil
	}
	return &ShardsUnreachableError{Op: op, Faults: faults}
}

// interval is d as a PostgreSQL interval literal's text, to the
// microsecond (what a time.Duration bound as a parameter is).
func interval(d time.Duration) string {
	return strconv.FormatInt(d.Microseconds(), 10) + " microseconds"
}

// timestamp is t as a timestamptz literal's text.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") }

// jsonText is v as JSON text, for a template's %L::json.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings and times only
	}
	return string(b)
}

// ShardHealth is one worker of the ledger's Citus cluster as the
// coordinator sees it now.
type ShardHealth struct {
	Node      string  `json:"node"`
	Shards    []int64 `json:"shards"`
	Reachable bool    `json:"reachable"`
	Err       string  `json:"error,omitempty"`
}

// CheckShards asks each worker holding shards of idempotency_keys for a
// trivial answer, one connection per worker from the coordinator (Citus's
// run_command_on_workers), and lists the workers with their shards and
// whether they answered. For /readyz and `status` on Citus.
func CheckShards(ctx context.Context, db ledger.DBTX) ([]ShardHealth, error) {
	rows, err := db.Query(ctx, `
WITH placed AS (
	SELECT n.nodename::text || ':' || n.nodeport AS node, n.nodename, n.nodeport,
	       array_agg(s.shardid ORDER BY s.shardid) AS shards
	FROM pg_dist_shard s
	JOIN pg_dist_placement p ON p.shardid = s.shardid
	JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
	WHERE s.logicalrelid = 'idempotency_keys'::regclass
	GROUP BY n.nodename, n.nodeport
), batch AS (
	SELECT array_agg(node ORDER BY node) AS nodes, array_agg(nodename::text ORDER BY node) AS names,
	       array_agg(nodeport ORDER BY node) AS ports, array_agg(shards ORDER BY node) AS shards
	FROM placed
)
SELECT p.node, p.shards, r.success, r.result
FROM batch b
CROSS JOIN LATERAL master_run_on_worker(b.names, b.ports, array_fill('SELECT 1'::text, ARRAY[cardinality(b.names)]), true)
     WITH ORDINALITY AS r(node_name, node_port, success, result, n)
JOIN placed p ON p.node = b.nodes[r.n]
ORDER BY p.node`)
	if err != nil {
		return nil, wrap("ask the Citus workers", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ShardHealth, error) {
		var h ShardHealth
		var result string
		err := r.Scan(&h.Node, &h.Shards, &h.Reachable, &result)
		if !h.Reachable {
			h.Err = result
		}
		return h, err
	})
	return out, wrap("ask the Citus workers", err)
}

// UnreachableShards is CheckShards as faults: the shards of the workers
// that did not answer (nil when all did).
func UnreachableShards(ctx context.Context, db ledger.DBTX) ([]ShardFault, error) {
	hs, err := CheckShards(ctx, db)
	if err != nil {
		return nil, err
	}
	var out []ShardFault
	for _, h := range hs {
		if h.Reachable {
			continue
		}
		for _, s := range h.Shards {
			out = append(out, ShardFault{Shard: s, Node: h.Node, Err: h.Err})
		}
	}
	return out, nil
}
