package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/migrations"
)

func newMigrateCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "migrate [up|status]",
		Short: "Apply (up, the default) or show (status) the schema migrations",
		Long: `Apply the embedded schema migrations, or show which are applied.
Running it twice is a no-op the second time; replicas may run it at once (an
advisory lock serialises them).`,
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
				applied, err := migrations.Up(ctx, pool, nil)
				if err != nil {
					return err
				}
				if asJSON {
					return a.writeJSON(map[string]any{"applied": applied})
				}
				if len(applied) == 0 {
					fmt.Fprintln(a.stdout, "schema is up to date; nothing to apply")
					return nil
				}
				for _, s := range applied {
					fmt.Fprintf(a.stdout, "applied %s\n", s.Name)
				}
				return nil
			}
			st, err := migrations.List(ctx, pool)
			if err != nil {
				return err
			}
			if asJSON {
				return a.writeJSON(map[string]any{"migrations": st})
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
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	return cmd
}
