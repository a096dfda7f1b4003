package alerts

import (
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

const (
	workerA = "citus-worker-1.db.internal:5432"
	workerB = "10.0.0.8:5433"
)

// workerAlert is a worker the coordinator cannot reach, with three shards.
func workerAlert(node string) NodeAlert {
	return NodeAlert{Node: node, Shards: []int64{102016, 102008, 102012, 102008},
		Error: "connection to the remote node postgres@" + node + " failed with the following error: Connection refused"}
}

func (b *bundle) raiseNode(t *testing.T, a NodeAlert) bool {
	t.Helper()
	raised, err := RaiseNode(b.ctx, b.db.Pool, a, time.Hour)
	if err != nil {
		t.Fatalf("RaiseNode(%s): %v", a.Node, err)
	}
	return raised
}

func (b *bundle) openNodes(t *testing.T) []string {
	t.Helper()
	nodes, err := OpenNodeAlerts(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// A worker that stays unreachable is one alert per outage, not one per
// pass or per key: raised again within renotify_after it enqueues nothing,
// and Slack gets one message. Its rows have no tool and no key.
func TestUnreachableWorkerAlertsOncePerOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	d := b.dispatcher(srv.botNotifier(t), nil)

	for i, want := range []bool{true, false, false} {
		if got := b.raiseNode(t, workerAlert(workerA)); got != want {
			t.Fatalf("raise %d = %v, want %v", i, got, want)
		}
	}
	if n := b.db.Count(t, "alert_state WHERE reason = 'shards_unreachable' AND subject = $1 AND tool IS NULL AND key IS NULL AND resolved_at IS NULL", "node:"+workerA); n != 1 {
		t.Fatalf("%d open alert_state rows for the worker, want 1 with no tool and no key", n)
	}
	if n := b.db.Count(t, "alert_outbox WHERE reason = 'shards_unreachable' AND tool IS NULL AND key IS NULL AND details->>'node' = $1", workerA); n != 1 {
		t.Fatalf("%d outbox rows for the worker, want 1 with no tool and no key", n)
	}
	if n := b.db.Count(t, "alert_outbox"); n != 1 {
		t.Fatalf("%d outbox rows in all, want 1", n)
	}
	if got := b.openNodes(t); !slices.Equal(got, []string{workerA}) {
		t.Errorf("OpenNodeAlerts = %q, want the worker", got)
	}

	rep := b.run(t, d)
	if rep.Claimed != 1 || rep.Messages != 1 || rep.Pending != 0 {
		t.Fatalf("report %+v, want 1 row claimed and posted", rep)
	}
	// Still unreachable at the next passes, still within renotify_after.
	b.raiseNode(t, workerAlert(workerA))
	if rep := b.run(t, d); rep.Claimed != 0 {
		t.Fatalf("second pass claimed %d", rep.Claimed)
	}
	if n := len(srv.accepted()); n != 1 {
		t.Fatalf("Slack got %d messages, want 1", n)
	}
}

// Each unreachable worker is a message of its own, and neither is merged
// into a tool's messages delivered in the same pass (nor they into it);
// workers come first, as they hide every key on their shards.
func TestUnreachableWorkersEachGetTheirOwnMessage(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv := newFakeSlack(t, nil)
			b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-1:step-1"))
			b.raiseNode(t, workerAlert(workerB))
			b.raise(t, keyAlert(ReasonProbeFailing, "create_ticket", "wf-2:step-1"))
			b.raise(t, Alert{Reason: ReasonDownstreamUnreachable, Tool: "create_ticket", Details: Details{Keys: 2}})
			b.raiseNode(t, workerAlert(workerA))

			d := b.dispatcher(tr.notifier(srv, t), nil)
			rep := b.run(t, d)
			if rep.Claimed != 5 || rep.Messages != 4 || rep.Delivered != 5 || rep.Pending != 0 {
				t.Fatalf("report %+v: want 5 rows in 4 messages (2 workers, the tool, its keys)", rep)
			}
			msgs := srv.accepted()
			texts := make([]string, len(msgs))
			for i, m := range msgs {
				texts[i] = strings.Join(m.texts(t), "\n")
			}
			// Workers first, by name; then the tool, then its keys.
			for i, w := range []string{workerB, workerA} {
				if !strings.Contains(texts[i], "🔴 Citus worker unreachable: 1 worker") || !strings.Contains(texts[i], "*Citus worker* `"+w+"`") {
					t.Errorf("message %d is not worker %s's:\n%s", i, w, texts[i])
				}
				other := workerA
				if w == workerA {
					other = workerB
				}
				if strings.Contains(texts[i], other) || strings.Contains(texts[i], "create_ticket") || len(msgs[i].keys(t)) != 0 {
					t.Errorf("worker %s's message carries another alert:\n%s", w, texts[i])
				}
			}
			if !strings.Contains(texts[2], "Downstream unreachable: 1 tool") {
				t.Errorf("third message:\n%s", texts[2])
			}
			if got := msgs[3].keys(t); !slices.Equal(got, []string{"wf-1:step-1", "wf-2:step-1"}) || !strings.Contains(texts[3], "Probe failing: 2 keys") {
				t.Errorf("fourth message keys %v:\n%s", got, texts[3])
			}
			for _, text := range texts[2:] {
				if strings.Contains(text, workerA) || strings.Contains(text, workerB) || strings.Contains(text, "Citus") {
					t.Errorf("a tool's message names a worker:\n%s", text)
				}
			}
			if n := b.db.Count(t, "alert_outbox WHERE status = 'sent'"); n != 5 {
				t.Errorf("%d rows sent, want 5", n)
			}
		})
	}
}

// Two workers' notices pending in one pass are two subjects: a worker
// back before any delivery gives one resolved entry saying so, and does
// not swallow the other worker's firing notice.
func TestUnreachableWorkersCollapseApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	b.raiseNode(t, workerAlert(workerA))
	b.raiseNode(t, workerAlert(workerB))
	if n, err := ResolveNode(b.ctx, b.db.Pool, workerA, "reachable again"); err != nil || n != 1 {
		t.Fatalf("ResolveNode = %d, %v", n, err)
	}
	rep := b.run(t, b.dispatcher(srv.webhookNotifier(t), nil))
	if rep.Claimed != 3 || rep.Messages != 2 || rep.Pending != 0 {
		t.Fatalf("report %+v: want 3 rows settled by 2 messages", rep)
	}
	msgs := srv.accepted()
	firing, resolved := strings.Join(msgs[0].texts(t), "\n"), strings.Join(msgs[1].texts(t), "\n")
	if !strings.HasPrefix(msgs[0].Text, "[FIRING]") || !strings.Contains(firing, workerB) || strings.Contains(firing, workerA) {
		t.Errorf("firing message, want worker B's only:\n%s", firing)
	}
	if !strings.HasPrefix(msgs[1].Text, "[RESOLVED]") || !strings.Contains(resolved, "*Citus worker* `"+workerA+"` reachable again.") ||
		!strings.Contains(resolved, "Unreachable and back before it could be delivered") || strings.Contains(resolved, workerB) {
		t.Errorf("resolved message, want worker A's, unreachable and back:\n%s", resolved)
	}
}

// A worker back is one resolved notice, "worker reachable again" and how;
// resolving again does nothing; the next outage is alerted at once.
func TestReachableWorkerResolvesItsAlertOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	d := b.dispatcher(srv.botNotifier(t), nil, func(c *Config) { c.Ledger = "billing" })
	b.raiseNode(t, workerAlert(workerA))
	b.raiseNode(t, workerAlert(workerB))
	if rep := b.run(t, d); rep.Messages != 2 {
		t.Fatalf("report %+v, want one firing message per worker", rep)
	}

	if n, err := ResolveNode(b.ctx, b.db.Pool, workerA, "reachable again after 12m"); err != nil || n != 1 {
		t.Fatalf("ResolveNode = %d, %v; want 1", n, err)
	}
	if n, err := ResolveNode(b.ctx, b.db.Pool, workerA, "again"); err != nil || n != 0 {
		t.Fatalf("second ResolveNode = %d, %v; want 0", n, err)
	}
	if got := b.openNodes(t); !slices.Equal(got, []string{workerB}) {
		t.Errorf("OpenNodeAlerts = %q, want worker B only", got)
	}
	if n := b.db.Count(t, "alert_outbox WHERE kind = 'resolved' AND tool IS NULL AND key IS NULL AND details->>'node' = $1", workerA); n != 1 {
		t.Fatalf("%d resolved notices for worker A, want 1 with no tool and no key", n)
	}
	rep := b.run(t, d)
	if rep.Messages != 1 || rep.Delivered != 1 {
		t.Fatalf("report %+v, want one resolved message", rep)
	}
	msgs := srv.accepted()
	if len(msgs) != 3 {
		t.Fatalf("Slack got %d messages, want 3", len(msgs))
	}
	msg := msgs[2]
	text := strings.Join(msg.texts(t), "\n")
	for _, want := range []string{
		"✅ Resolved: Citus worker unreachable (1 worker) · ledger billing",
		"*Citus worker* `" + workerA + "` reachable again.",
		"*Resolved:* reachable again after 12m",
		"<" + testRunbook + "#shards_unreachable|runbook: shards_unreachable>",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("resolved message lacks %q:\n%s", want, text)
		}
	}
	if !strings.HasPrefix(msg.Text, "[RESOLVED] Ledger `billing`: Citus worker unreachable: 1 worker.") {
		t.Errorf("notification text %q", msg.Text)
	}

	// The worker goes away again: a new outage, alerted at once.
	if !b.raiseNode(t, workerAlert(workerA)) {
		t.Fatal("a new outage after the worker came back was not raised")
	}
}

// The message says which worker, which shards, what it means for their
// keys and for the rest, the error (escaped, in a code block: no mention,
// no link, no bold), the runbook section and the ledger; it carries no
// control even on an interactive dispatcher, since there is no key.
func TestUnreachableWorkerMessageNamesWorkerAndShardsAndEscapesTheError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := newFakeSlack(t, nil)
	a := workerAlert(workerA)
	a.Error = "connection to the remote node <!channel> failed: *bold* <https://evil.example|runbook> & <@U123>"
	b.raiseNode(t, a)
	d := b.dispatcher(srv.botNotifier(t), nil, func(c *Config) { c.Ledger = "billing"; c.Interactive = true })
	b.run(t, d)

	msgs := srv.accepted()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	all := msgs[0].texts(t)
	text := strings.Join(all, "\n")
	for _, want := range []string{
		"🔴 Citus worker unreachable: 1 worker · ledger billing",
		"*Citus worker* `" + workerA + "` cannot be reached from the coordinator.",
		"*Shards of idempotency_keys on it (3):* `102008, 102012, 102016`",
		"neither probed nor decided nor purged until the worker is back",
		"Every other shard goes on being reconciled and purged.",
		"*Error:* ```connection to the remote node &lt;!channel&gt; failed: *bold* &lt;https://evil.example|runbook&gt; &amp; &lt;@U123&gt;```",
		"SELECT * FROM citus_check_cluster_node_health();",
		"pg_isready -h citus-worker-1.db.internal -p 5432",
		"<" + testRunbook + "#shards_unreachable|runbook: shards_unreachable>",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("message lacks %q:\n%s", want, text)
		}
	}
	if !strings.HasPrefix(msgs[0].Text, "[FIRING] Ledger `billing`: Citus worker unreachable: 1 worker.") || !strings.Contains(msgs[0].Text, "`"+workerA+"`") {
		t.Errorf("notification text %q", msgs[0].Text)
	}
	ours := "<" + testRunbook + "#"
	for _, s := range all {
		for rest := s; strings.Contains(rest, "<"); {
			i := strings.Index(rest, "<")
			if !strings.HasPrefix(rest[i:], ours) {
				t.Errorf("a '<' that is not our runbook link: %q", rest[i:min(len(rest), i+40)])
			}
			rest = rest[i+1:]
		}
	}
	if strings.Contains(msgs[0].Blocks, `"actions"`) || strings.Contains(msgs[0].Blocks, `"accessory"`) || strings.Contains(text, "ledgerkeeper inspect") {
		t.Errorf("a worker's message carries a control or a key's command: %s", msgs[0].Blocks)
	}
}

// Two workers raised in one transaction share one instant: the console's
// firing list pairs each with its own message, and names the worker.
func TestFiringListPairsEachWorkerWithItsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	for _, w := range []string{workerA, workerB} {
		if _, err := RaiseNode(b.ctx, tx, workerAlert(w), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	firing, err := FiringAfter(b.ctx, b.db.Pool, "", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(firing) != 2 {
		t.Fatalf("%d firing alerts, want 2", len(firing))
	}
	var ids []int64
	for _, f := range firing {
		if f.Node == "" || f.Tool != "" || f.Key != "" || f.Subject != "node:"+f.Node || f.Message == nil || f.Message.Node != f.Node {
			t.Fatalf("firing alert %+v (message %+v): not paired with its own worker's message", f, f.Message)
		}
		ids = append(ids, f.Message.ID)
	}
	if ids[0] == ids[1] {
		t.Errorf("both workers point at message %d", ids[0])
	}
	rows, err := OutboxBefore(b.ctx, b.db.Pool, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Node != workerB || rows[1].Node != workerA || rows[0].Tool != "" {
		t.Errorf("outbox rows %+v: want worker B's then A's", rows)
	}
	if open, err := OpenKeyAlerts(b.ctx, b.db.Pool, 10); err != nil || len(open) != 0 {
		t.Errorf("OpenKeyAlerts = %v, %v: a worker's alert is not a key's", open, err)
	}
}

// RaiseNode keeps the shards sorted, once each, and at most
// maxStoredShards of them, counting them all; a worker's name must fit
// alert_state.subject, and an empty one is a programming error.
func TestRaiseNodeStoresShardsAndChecksTheName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var many []int64
	for i := range 1500 {
		many = append(many, int64(200000+1500-i), int64(200000+1500-i))
	}
	b.raiseNode(t, NodeAlert{Node: workerA, Shards: many})
	var count, stored int
	var first, last int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (details->>'shard_count')::int, jsonb_array_length(details->'shards'),
			(details->'shards'->>0)::bigint, (details->'shards'->>(-1))::bigint FROM alert_outbox`).Scan(&count, &stored, &first, &last); err != nil {
		t.Fatal(err)
	}
	if count != 1500 || stored != maxStoredShards || first != 200001 || last != 200000+maxStoredShards {
		t.Errorf("stored %d of %d shards, %d…%d; want %d of 1500, ascending from 200001", stored, count, first, last, maxStoredShards)
	}

	long := strings.Repeat("w", maxNodeLen-5) + ":5432"
	if !b.raiseNode(t, NodeAlert{Node: long}) {
		t.Errorf("a name of %d characters was not raised", utf8.RuneCountInString(long))
	}
	if _, err := RaiseNode(b.ctx, b.db.Pool, NodeAlert{Node: "w" + long}, time.Hour); err == nil || !strings.Contains(err.Error(), "more than the 195") {
		t.Errorf("a name too long for alert_state: %v", err)
	}
	if _, err := ResolveNode(b.ctx, b.db.Pool, "w"+long, "back"); err == nil {
		t.Error("ResolveNode took a name too long for alert_state")
	}
	defer func() {
		if recover() == nil {
			t.Error("RaiseNode without a worker did not panic")
		}
	}()
	_, _ = RaiseNode(b.ctx, b.db.Pool, NodeAlert{}, time.Hour)
}

// The shard list of a message: every id up to maxListedShards, then the
// count of the rest, whether the rest was stored or not.
func TestShardListListsThenCounts(t *testing.T) {
	ids := func(from, n int) []int64 {
		var out []int64
		for i := range n {
			out = append(out, int64(from+i))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		d    Details
		want string
		more bool
	}{
		{"none given", Details{}, "*Shards of idempotency_keys on it:* not named.", false},
		{"one", Details{Shards: []int64{102008}, ShardCount: 1}, "*Shards of idempotency_keys on it (1):* `102008`", false},
		{"count missing", Details{Shards: []int64{1, 2}}, "*Shards of idempotency_keys on it (2):* `1, 2`", false},
		{"all listed", Details{Shards: ids(1, maxListedShards), ShardCount: maxListedShards}, ", 39, 40`", false},
		{"one more than listed", Details{Shards: ids(1, maxListedShards+1), ShardCount: maxListedShards + 1}, ", 40` and 1 more", true},
		{"more than stored", Details{Shards: ids(1, maxStoredShards), ShardCount: 1500}, "(1500):* `1, 2, 3, ", true},
		{"more than stored, counted", Details{Shards: ids(1, maxStoredShards), ShardCount: 1500}, ", 40` and 1460 more", true},
		{"counted only", Details{ShardCount: 7}, "*Shards of idempotency_keys on it (7):* 7 more", true},
	} {
		got := shardList(tc.d)
		if !strings.Contains(got, tc.want) || strings.Contains(got, "more") != tc.more {
			t.Errorf("%s: %q; want %q, more %v", tc.name, got, tc.want, tc.more)
		}
	}
}

// The checks under a worker: pg_isready on its host and port when the name
// has both (IPv6 included), Citus's health check always.
func TestNodeChecks(t *testing.T) {
	for node, want := range map[string]string{
		"10.0.0.7:5432":                    "pg_isready -h 10.0.0.7 -p 5432",
		"[fd00::7]:5432":                   "pg_isready -h fd00::7 -p 5432",
		"worker one:5432":                  "pg_isready -h 'worker one' -p 5432",
		"no-port":                          "",
		strings.Repeat("h", 190) + ":5432": "pg_isready -h " + strings.Repeat("h", 190),
	} {
		got := nodeChecks(node)
		if !strings.Contains(got, "SELECT * FROM citus_check_cluster_node_health();") {
			t.Errorf("%s: no health check: %s", node, got)
		}
		if (want == "") == strings.Contains(got, "pg_isready") || !strings.Contains(got, want) {
			t.Errorf("%s: %s; want %q", node, got, want)
		}
	}
}
