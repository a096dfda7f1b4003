package alerts

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
)

// maxListedShards bounds the shard ids a message lists; the rest are
// counted.
const maxListedShards = 40

// nodeText describes one unreachable Citus worker (shards_unreachable):
// which worker, which shards of idempotency_keys, what that means for their
// keys and for the rest, the error Citus gave and how to check the worker.
// There is no key to act on, so no command of ledgerkeeper and no control.
// Every value from the ledger goes through escape (via inline, codeBlock or
// escTrunc), within the 3000 characters of a section: 200 for the worker,
// 400 for the shards, 1000 for the error, 700 for the checks, 500 for the
// rest.
func nodeText(kind Kind, it item) string {
	d := it.details
	var b strings.Builder
	if kind == KindResolved {
		b.WriteString("*Citus worker* " + inline(d.Node, 200) + " reachable again.")
		if it.firedToo {
			b.WriteString("\n*Unreachable and back before it could be delivered:* nothing to do.")
		}
		if d.Resolution != "" {
			b.WriteString("\n*Resolved:* " + escTrunc(oneLine(d.Resolution), 200))
		}
		return b.String()
	}
	b.WriteString("*Citus worker* " + inline(d.Node, 200) + " cannot be reached from the coordinator.")
	b.WriteString("\n" + shardList(d))
	b.WriteString("\nThe keys on these shards stay processing: they are neither probed nor decided nor purged until the worker is back, and tool servers' claims of them fail. Every other shard goes on being reconciled and purged.")
	if d.LastError != "" {
		b.WriteString("\n*Error:* " + codeBlock(safetext.ClipRunes(d.LastError, maxErrorRunes), 1000))
	}
	b.WriteString("\n*Check:* " + nodeChecks(d.Node))
	return b.String()
}

// shardList names the shards of idempotency_keys on the worker: the first
// maxListedShards ids and the count of the rest.
func shardList(d Details) string {
	total := max(d.ShardCount, len(d.Shards))
	if total == 0 {
		return "*Shards of idempotency_keys on it:* not named."
	}
	listed := d.Shards[:min(len(d.Shards), maxListedShards)]
	ids := make([]string, 0, len(listed))
	for _, id := range listed {
		ids = append(ids, strconv.FormatInt(id, 10))
	}
	s := fmt.Sprintf("*Shards of idempotency_keys on it (%d):* ", total)
	if len(ids) > 0 {
		s += inline(strings.Join(ids, ", "), 400)
	}
	if rest := total - len(listed); rest > 0 {
		if len(ids) > 0 {
			s += " and "
		}
		s += fmt.Sprintf("%d more", rest)
	}
	return s
}

// nodeChecks is how to check the worker: Citus's own health check on the
// coordinator, and pg_isready on the worker's host and port when the name
// splits into them.
func nodeChecks(node string) string {
	lines := []string{"# on the coordinator, in psql:", "SELECT * FROM citus_check_cluster_node_health();"}
	sql := strings.Join(lines, "\n")
	if host, port, err := net.SplitHostPort(node); err == nil && host != "" && port != "" {
		lines = append(lines, "# from a host that reaches the worker:", "pg_isready -h "+shellQuote(host)+" -p "+shellQuote(port))
	}
	text := strings.Join(lines, "\n")
	if utf8.RuneCountInString(escape(text)) > 690 || strings.Contains(text, "```") {
		text = sql // a name too long, or one that would close the fence
	}
	return codeBlock(text, 700)
}
