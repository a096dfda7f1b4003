package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
)

func newConfigCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the configuration file",
	}
	var asJSON, connect bool
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate the configuration and print the effective settings (secrets masked)",
		Long: `Validate the configuration file and print the effective settings, defaults
filled in and secrets masked. Exits 2 naming the file, line and key of every
problem found. Settings that are valid but dangerous (a self-check turned
off, not_found_on_404: any, self_check.require_witness: false) are named on
stderr as warnings; they do not change the exit code.

Nothing connects unless --connect is given: then each sql probe connects to
its downstream and prepares its query there (without running it): PostgreSQL
must accept it as one statement, its parameter count must equal len(args),
and every column response_body maps must be among its result columns. A
downstream that cannot be reached exits 1.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			a.manyLedgers = true
			if err := a.load(); err != nil {
				return err
			}
			var connected []string
			for _, l := range a.targets() {
				prefix := ""
				if a.all.Fleet() {
					prefix = "ledger " + l.Name + ": "
				}
				// Build the probes too (nothing connects): a URL template
				// or a query the probe would refuse is a configuration
				// error now, not at the first reconcile pass.
				_, closer, err := daemon.BuildProbes(cmd.Context(), l.Config, a.registry())
				if err != nil {
					if prefix != "" {
						return &configError{fmt.Errorf("%s%w", prefix, err)}
					}
					return &configError{err}
				}
				closer.Close()
				// Valid but dangerous settings: said on stderr, so that
				// stdout stays the effective configuration; they do not
				// change the exit code.
				for _, w := range daemon.Warnings(l.Config) {
					fmt.Fprintf(a.stderr, "warning: %s%s\n", prefix, a.redactor().String(w))
				}
				if connect {
					got, err := checkSQLProbes(cmd.Context(), l.Config)
					if err != nil {
						return err
					}
					for _, c := range got {
						connected = append(connected, prefix+c)
					}
				}
			}
			if asJSON {
				return a.writeJSON(a.cfg)
			}
			// Through JSON, so that Secret settings go through their
			// masking marshaller and every other string through the
			// redactor (a token inside a probe URL's query), then as YAML
			// for people.
			b, err := json.Marshal(a.cfg)
			if err != nil {
				return err
			}
			var generic map[string]any
			dec := json.NewDecoder(bytes.NewReader(a.redactor().JSON(b)))
			dec.UseNumber() // 1048576 stays 1048576, not 1.048576e+06
			if err := dec.Decode(&generic); err != nil {
				return err
			}
			src := a.cfg.File
			if src == "" {
				src = "built-in defaults (no file)"
			}
			fmt.Fprintf(a.stdout, "# configuration OK: %s\n", src)
			fmt.Fprintf(a.stdout, "# %s\n", daemon.InteractiveSummary(a.cfg))
			fmt.Fprintf(a.stdout, "# %s\n", daemon.ConsoleCheckSummary(a.cfg))
			if a.all.Fleet() {
				for _, l := range a.targets() {
					fmt.Fprintf(a.stdout, "# ledger %s: database %s, schema %s, %d tool(s)\n", l.Name,
						databaseLabel(l.Database.URL.Reveal()), schemaShown(l.Database.Schema), len(l.ToolNames()))
				}
			}
			for _, l := range connected {
				fmt.Fprintf(a.stdout, "# --connect: %s\n", l)
			}
			out, err := yaml.Marshal(plainNumbers(generic))
			if err != nil {
				return err
			}
			_, err = a.stdout.Write(out)
			return err
		},
	}
	check.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	check.Flags().BoolVar(&connect, "connect", false, "connect to each sql probe's downstream and prepare its query there")
	cmd.AddCommand(check)
	parentOnly(cmd, false)
	return cmd
}

// plainNumbers turns the json.Numbers of a decoded document into int64
// or float64, so that YAML prints them as numbers, integers in full.
func plainNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = plainNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = plainNumbers(e)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
	}
	return v
}
