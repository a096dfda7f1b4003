package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

func newMigrateCmd(a *app) *cobra.Command {
	var asJSON, distributed bool
	cmd := &cobra.Command{
		Use:   "migrate [up|status]",
		Short: "Apply (up, the default) or show (status) the schema migrations",
		Long: `Apply the embedded schema migrations, or show which are applied.
Running it twice is a no-op the second time; replicas may run it at once (an
advisory lock serialises them).

On a Citus coordinator (the citus extension is installed; --distributed
requires it) the tables are then laid out once: idempotency_keys
distributed by key, the reconciler's per-key tables co-located with it, the
small shared tables left on the coordinator (ARCHITECTURE.md, "Running on
Citus"). status then shows each table's shape.`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			sub := "up"
			if len(argv) == 1 {
				sub = argv[0]
			}
			if sub != "up" && sub != "status" {
				return unknownCommand(sub, cmd.CommandPath(), []string{"up", "status"})
			}
			ctx := cmd.Context()
			a.manyLedgers = true
			if err := a.load(); err != nil {
				return err
			}
			targets := a.targets()
			if !a.all.Fleet() {
				pool, err := a.pool(ctx)
				if err != nil {
					return err
				}
				defer pool.Close()
				doc, err := a.migrateOne(ctx, pool, sub, distributed, asJSON, "")
				if err != nil || !asJSON {
					return err
				}
				return a.writeJSON(doc)
			}
			// Every ledger (or the one of --ledger), each in its own
			// schema with its own history; one failing does not stop the
			// others, and the command fails if any did.
			var failed []string
			docs := map[string]any{}
			for _, l := range targets {
				pool, err := connectLedger(ctx, l)
				if err == nil {
					var doc any
					doc, err = a.migrateOne(ctx, pool, sub, distributed, asJSON, l.Name)
					docs[l.Name] = doc
					pool.Close()
				}
				if err != nil {
					failed = append(failed, l.Name)
					fmt.Fprintf(a.stderr, "ledger %s: %v\n", l.Name, a.redactor().String(err.Error()))
					if asJSON {
						docs[l.Name] = map[string]string{"error": a.redactor().String(err.Error())}
					}
				}
			}
			if asJSON {
				if err := a.writeJSON(map[string]any{"ledgers": docs}); err != nil {
					return err
				}
			}
			if len(failed) > 0 {
				return fmt.Errorf("migrate %s failed for ledger(s) %s", sub, strings.Join(failed, ", "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	cmd.Flags().BoolVar(&distributed, "distributed", false, "require a Citus coordinator (fail without the citus extension) and lay the tables out on it")
	return cmd
}

// migrateOne is migrate SUB for one ledger; label prefixes its lines ("":
// the single-ledger output, unchanged). With asJSON it prints nothing and
// returns the document.
func (a *app) migrateOne(ctx context.Context, pool *ledgerDB, sub string, distributed, asJSON bool, label string) (any, error) {
	prefix := ""
	if label != "" {
		prefix = "ledger " + label + ": "
	}
	if sub == "up" {
		r, err := migrations.Apply(ctx, pool.raw, migrations.Options{Distributed: distributed, Schema: pool.schema})
		if err != nil {
			return nil, err
		}
		if asJSON {
			return r, nil
		}
		if len(r.Applied) == 0 && len(r.Distributed) == 0 {
			fmt.Fprintln(a.stdout, prefix+"schema is up to date; nothing to apply")
			return nil, nil
		}
		for _, s := range r.Applied {
			fmt.Fprintf(a.stdout, "%sapplied %s\n", prefix, s.Name)
		}
		for _, p := range r.Distributed {
			fmt.Fprintf(a.stdout, "%sdistributed %s by %s (citus)\n", prefix, p.Table, p.Column)
		}
		return nil, nil
	}
	st, err := migrations.ListIn(ctx, pool.raw, pool.schema)
	if err != nil {
		return nil, err
	}
	citus, err := migrations.IsCitus(ctx, pool.raw)
	if err != nil {
		return nil, err
	}
	var placed []migrations.Placed
	if citus && pool.schema == "" {
		if placed, err = migrations.Placements(ctx, pool.raw); err != nil {
			return nil, err
		}
	}
	if asJSON {
		out := map[string]any{"migrations": st}
		if citus {
			out["citus"] = placed
		}
		return out, nil
	}
	if label != "" {
		fmt.Fprintf(a.stdout, "ledger %s:\n", label)
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tNAME\tSTATE")
	for _, s := range st {
		state := "pending"
		if s.Applied {
			state = "applied"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\n", s.Version, s.Name, state)
	}
	if citus {
		fmt.Fprintln(w, "\nTABLE\tCITUS SHAPE\tCOLUMN\tSHARDS\tCOLOCATION")
		for _, p := range placed {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\n", p.Table, p.Shape, p.Column, p.Shards, p.Colocation)
		}
	}
	return nil, w.Flush()
}
