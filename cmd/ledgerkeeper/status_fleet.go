package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// fleetLedgerStatus is one ledger's line in `status` over every ledger:
// its whole report, or why it could not be read.
type fleetLedgerStatus struct {
	Database string        `json:"database"`
	Schema   string        `json:"schema,omitempty"`
	Error    string        `json:"error,omitempty"`
	Status   *statusReport `json:"status,omitempty"`
}

// fleetStatus is `status` without --ledger in a configuration that keeps
// several ledgers: every ledger read (one unreachable does not stop the
// others), one summary line each, then their warnings; --json prints
// every ledger's whole report. It fails when any ledger could not be
// read.
func (a *app) fleetStatus(ctx context.Context, exact, asJSON bool) error {
	out := map[string]fleetLedgerStatus{}
	all := a.cfg
	defer func() { a.cfg = all }()
	var failed int
	for _, l := range a.all.Ledgers() {
		fs := fleetLedgerStatus{Database: databaseLabel(l.Database.URL.Reveal()), Schema: l.Database.Schema}
		a.cfg = l.Config // statusOf and a.windows read the ledger's settings
		st, err := a.ledgerStatus(ctx, l.Name, exact)
		if err != nil {
			failed++
			fs.Error = a.redactor().String(err.Error())
		} else {
			fs.Status = &st
		}
		out[l.Name] = fs
	}
	if asJSON {
		if err := a.writeJSON(map[string]any{"at": time.Now().UTC(), "ledgers": out}); err != nil {
			return err
		}
	} else {
		printFleetStatus(a, out)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d ledgers could not be read (see above)", failed, len(out))
	}
	return nil
}

// ledgerStatus is the status report of ledger name (a.cfg is its
// configuration).
func (a *app) ledgerStatus(ctx context.Context, name string, exact bool) (statusReport, error) {
	l, err := a.all.Ledger(name)
	if err != nil {
		return statusReport{}, err
	}
	pool, err := connectLedger(ctx, l)
	if err != nil {
		return statusReport{}, err
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool.raw, pool.schema); err != nil {
		return statusReport{}, err
	}
	return a.statusOf(ctx, pool, exact)
}

func printFleetStatus(a *app, out map[string]fleetLedgerStatus) {
	fmt.Fprintf(a.stdout, "ledgerkeeper status of %d ledgers at %s\n\n", len(out), ts(time.Now().UTC()))
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "LEDGER\tDATABASE\tSCHEMA\tSTUCK\tOLDEST STUCK\tHELD\tBREAKERS OPEN\tUNTRUSTED PROBES\tPENDING ALERTS\tSTATE")
	var warnings []string
	for _, name := range a.all.LedgerNames() {
		fs := out[name]
		if fs.Status == nil {
			fmt.Fprintf(w, "%s\t%s\t%s\t-\t-\t-\t-\t-\t-\tunreadable: %s\n", name, fs.Database, schemaShown(fs.Schema), fs.Error)
			continue
		}
		st := fs.Status
		stuck, oldest, open, untrusted := 0, 0.0, 0, 0
		for _, t := range st.Tools {
			stuck += t.Stuck
			oldest = max(oldest, t.OldestStuckAgeSeconds)
		}
		for _, b := range st.Breakers {
			if b.Open {
				open++
			}
		}
		for _, c := range st.ProbeChecks {
			if c.Outcome == reconcile.CheckUntrusted && !c.Disabled {
				untrusted++
			}
		}
		age := "-"
		if stuck > 0 {
			age = (time.Duration(oldest) * time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\tok\n", name, fs.Database, schemaShown(fs.Schema), stuck, age, len(st.Holds), open, untrusted, st.Alerts.Pending)
		for _, wn := range st.Warnings {
			warnings = append(warnings, "ledger "+name+": "+wn)
		}
	}
	_ = w.Flush()
	if len(warnings) > 0 {
		fmt.Fprintln(a.stdout, "\nwarnings:")
		for _, wn := range warnings {
			fmt.Fprintln(a.stdout, "  "+wn)
		}
	}
	fmt.Fprintln(a.stdout, "\nOne ledger in full: ledgerkeeper status --ledger NAME")
}
