package main

import (
	"fmt"
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
			pool, err := a.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if sub == "up" {
				r, err := migrations.Apply(ctx, pool, migrations.Options{Distributed: distributed})
				if err != nil {
					return err
				}
				if asJSON {
					return a.writeJSON(r)
				}
				if len(r.Applied) == 0 && len(r.Distributed) == 0 {
					fmt.Fprintln(a.stdout, "schema is up to date; nothing to apply")
					return nil
				}
				for _, s := range r.Applied {
					fmt.Fprintf(a.stdout, "applied %s\n", s.Name)
				}
				for _, p := range r.Distributed {
					fmt.Fprintf(a.stdout, "distributed %s by %s (citus)\n", p.Table, p.Column)
				}
				return nil
			}
			st, err := migrations.List(ctx, pool)
			if err != nil {
				return err
			}
			citus, err := migrations.IsCitus(ctx, pool)
			if err != nil {
				return err
			}
			var placed []migrations.Placed
			if citus {
				if placed, err = migrations.Placements(ctx, pool); err != nil {
					return err
				}
			}
			if asJSON {
				out := map[string]any{"migrations": st}
				if citus {
					out["citus"] = placed
				}
				return a.writeJSON(out)
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
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	cmd.Flags().BoolVar(&distributed, "distributed", false, "require a Citus coordinator (fail without the citus extension) and lay the tables out on it")
	return cmd
}
