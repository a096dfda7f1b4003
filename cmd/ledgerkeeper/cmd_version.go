package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/internal/version"
)

// newVersionCmd prints which release this binary is: the same version,
// revision and Go version as serve's ledgerkeeper_build_info metric. It reads
// no configuration and needs no database, so it works in any container.
func newVersionCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, VCS revision and Go version of this binary",
		Long: `Print which release this binary is. A release build is stamped by
deploy/build.sh (git describe); a plain go build or go run reports the VCS
revision the Go toolchain recorded, with -dirty for uncommitted changes.
serve exports the same as the ledgerkeeper_build_info metric.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			if asJSON {
				b, err := json.MarshalIndent(struct {
					Version   string `json:"version"`
					Revision  string `json:"revision"`
					GoVersion string `json:"go_version"`
				}{info.Version, info.Revision, info.GoVersion}, "", "  ")
				if err != nil {
					return fmt.Errorf("version: encode JSON: %w", err)
				}
				fmt.Fprintln(a.stdout, string(b))
				return nil
			}
			fmt.Fprintln(a.stdout, info.String())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (version, revision, go_version)")
	return cmd
}

// setVersionFlag gives the root command --version, printing the same line as
// `ledgerkeeper version`.
func setVersionFlag(root *cobra.Command) {
	root.Version = version.Get().Version
	root.SetVersionTemplate(version.Get().String() + "\n")
}
