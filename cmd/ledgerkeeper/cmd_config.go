package main

import (
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
	var asJSON bool
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate the configuration and print the effective settings (secrets masked)",
		Long: `Validate the configuration file and print the effective settings, defaults
filled in and secrets masked. Exits 2 naming the file, line and key of every
problem found.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(); err != nil {
				return err
			}
			// Build the probes too (nothing connects): a URL template or a
			// query the probe would refuse is a configuration error now,
			// not at the first reconcile pass.
			_, closer, err := daemon.BuildProbes(cmd.Context(), a.cfg, a.registry())
			if err != nil {
				return &configError{err}
			}
			closer.Close()
			if asJSON {
				return a.writeJSON(a.cfg)
			}
			// Round-trip through JSON so secrets go through their masking
			// marshaller, then print as YAML for people.
			var generic map[string]any
			if err := roundTrip(a.cfg, &generic); err != nil {
				return err
			}
			src := a.cfg.File
			if src == "" {
				src = "built-in defaults (no file)"
			}
			fmt.Fprintf(a.stdout, "# configuration OK: %s\n", src)
			out, err := yaml.Marshal(generic)
			if err != nil {
				return err
			}
			_, err = a.stdout.Write(out)
			return err
		},
	}
	check.Flags().BoolVar(&asJSON, "json", false, "print one JSON document")
	cmd.AddCommand(check)
	return cmd
}
