// Command lkbench measures ledgerkeeper against a real PostgreSQL, one
// subcommand per concern:
//
//	lkbench purge [flags]   purge variants side by side under a fixed-rate writer
//	lkbench rss [flags]     memory of a pass over backlogs of several sizes
//	lkbench bigledger [flags]  operator commands and daemon statements on big ledgers
//	lkbench reconcile [flags]   reconcile throughput, durable vs non-durable commits
//	lkbench hotpath [flags]     the tool side's middleware against the raw minimum
//	lkbench fleet [flags]       one process over many ledgers against one ledger; a ledger whose database hangs
//	lkbench engines [flags]     claims and a reconcile pass on PostgreSQL against Citus, with each node's CPU
//
// Each subcommand runs against an ephemeral durable cluster started from the
// local PostgreSQL binaries (fsync on, so WAL and commit costs are real), or
// against --database-url (a server where the user may create databases);
// engines starts its own servers, all non-durable as internal/citustest's
// Citus nodes are.
// Results go to stdout as a table (and --json FILE); progress to stderr.
// BENCHMARKS.md records the runs and the commands that reproduce them.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// subcommands maps a name to its entry point; each parses its own flags.
var subcommands = map[string]struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}{
	"bigledger":  {"status, inspect, metrics refresh, lease, purge and reconcile on ledgers of 1, 5 and 20 million keys", runBigLedger},
	"bigconsole": {"the web console's pages on a ledger kept by `bigledger --keep` (again, e.g. after the console changed)", runBigConsole},
	"purge":      {"purge variants side by side under a fixed-rate claim+complete writer", runPurge},
	"rss":        {"peak RSS of the ledgerkeeper binary's pass over stuck backlogs of several sizes", runRSS},
	"hotpath":    {"ledger.Middleware against the raw minimum at open-loop arrival rates; Claim under contention", runHotPath},
	"reconcile":  {"reconcile throughput against a 20 ms downstream, durable and non-durable clusters side by side", runReconcile},
	"engines":    {"claims/s and reconcile keys/s on plain PostgreSQL against a Citus coordinator and 2 workers, CPU per node", runEngines},
	"fleet":      {"reconcile over 50 ledgers (schemas of two databases) against the same keys in one; the others beside a ledger whose database hangs", runFleet},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(os.Stderr)
		os.Exit(2)
	}
	sc, ok := subcommands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "lkbench: unknown subcommand %q\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
	if err := sc.run(ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "lkbench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: lkbench SUBCOMMAND [flags]   (lkbench SUBCOMMAND -h for its flags)")
	names := make([]string, 0, len(subcommands))
	for n := range subcommands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, subcommands[n].summary)
	}
}
