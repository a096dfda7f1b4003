package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// checkSQLProbes is `config check --connect`: each sql probe connects to its
// downstream and prepares its query there (nothing runs), so a query
// PostgreSQL refuses, a parameter count that differs from args, or a
// response_body column the query does not return is a configuration error
// now, with the tool's config key, instead of an unknown at every probe.
// It returns one line per probe checked. A mistake in the configuration is
// a *configError (exit 2); a downstream that cannot be reached is an
// operational failure (exit 1), since nothing could be verified.
func checkSQLProbes(ctx context.Context, cfg *config.Config) ([]string, error) {
	var lines []string
	var cfgErrs config.Errors
	var unreachable []string
	for _, name := range cfg.ToolNames() {
		pc := cfg.Tools[name].Probe
		if pc == nil || pc.Type != "sql" {
			continue
		}
		base := "tools." + name + ".probe"
		p, err := probes.NewSQL(ctx, probes.SQLConfig{
			DatabaseURL: pc.DatabaseURL.Reveal(), Query: pc.Query, Args: pc.Args, Timeout: pc.Timeout.D(),
			ResponseCode: pc.ResponseCode, ResponseBody: pc.ResponseBody, MaxConns: 1,
		})
		if err != nil {
			cfgErrs = append(cfgErrs, cfg.ErrorAt(base, "%v", err))
			continue
		}
		err = p.Check(ctx)
		_ = p.Close()
		var ce *probes.SQLCheckError
		switch {
		case err == nil:
			lines = append(lines, fmt.Sprintf("tool %s: sql probe's query prepared on its downstream: parameters match args, mapped columns present", name))
		case errors.As(err, &ce):
			cfgErrs = append(cfgErrs, cfg.ErrorAt(base+"."+ce.Field, "sql probe of tool %s: %v", name, ce))
		default:
			unreachable = append(unreachable, fmt.Sprintf("tool %s (%s.database_url): %v", name, base, err))
		}
	}
	if len(unreachable) > 0 {
		msg := "config check --connect could not verify every sql probe:\n  " + strings.Join(unreachable, "\n  ")
		if len(cfgErrs) > 0 {
			msg += "\nand found these configuration errors:\n" + cfgErrs.Error()
		}
		return nil, errors.New(msg)
	}
	if len(cfgErrs) > 0 {
		return nil, &configError{cfgErrs}
	}
	return lines, nil
}
