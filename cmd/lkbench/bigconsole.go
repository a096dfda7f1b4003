package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/console"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// The console's budget on a big ledger (issue: every page's server time
// under 200 ms on 20M keys, no page heavier than 150 KB).
const (
	consoleBudget      = 200 * time.Millisecond
	consoleBudgetBytes = 150 << 10
)

// bigConsolePages are the console's pages as on-call opens them on the big
// ledger: the overview, every listing's filter shape, a key, and the
// operational pages. op-2 is a stuck create_ticket key of the operator
// population, op-1520 one on hold, bl-1234:charge_card a completed one.
var bigConsolePages = []string{
	"/ui/",
	"/ui/keys",
	"/ui/keys?tool=create_ticket",
	"/ui/keys?tool=create_ticket&status=processing",
	"/ui/keys?tool=create_ticket&stuck=1",
	"/ui/keys?status=failed_retryable",
	"/ui/keys?prefix=op-1",
	"/ui/keys?held=yes",
	"/ui/keys?status=processing",
	"/ui/keys?status=processing&held=no",
	"/ui/keys?attempts=2",
	"/ui/keys?older_than=90m&attempts=1",
	"/ui/keys?tool=send_email&status=completed&after=bl-5",
	"/ui/key?key=op-2",
	"/ui/key?key=op-1520",
	bigCompletedKeyPage,
	"/ui/overview/live",
	"/ui/checks",
	"/ui/alerts",
	"/ui/runs",
	"/ui/bulk?action=hold&tool=create_ticket&stuck=1",
	"/ui/bulk?action=retryable&tool=create_ticket&stuck=1",
	"/ui/bulk?action=release&held=yes",
	"/ui/bulk?action=hold&tool=send_email&status=completed",
}

// bigCompletedKeyPage is the page of a completed key (in the spread layout;
// the time layout's is another key, see measureConsole).
const bigCompletedKeyPage = "/ui/key?key=bl-1234:charge_card"

// bigConsolePage is one page's cost at one ledger size.
type bigConsolePage struct {
	Path string `json:"path"`
	// Seconds are the repetitions' request times, measured at the client
	// over loopback (the server's time plus a loopback round trip).
	Seconds []float64 `json:"seconds"`
	Median  float64   `json:"median_seconds"`
	Max     float64   `json:"max_seconds"`
	Bytes   int       `json:"bytes"`
	Status  int       `json:"status"`
}

// measureConsole serves the console over the big ledger (auth none on
// loopback, every action granted, so that every form is drawn) and times
// each page of bigConsolePages reps times, after one unmeasured request
// (the first parse of a plan is not what on-call waits for twice).
func (b *bigBench) measureConsole(ctx context.Context, res *bigSize) error {
	window := bigWindow + 10*time.Second
	h, err := console.New(console.Config{
		Pool:      b.db,
		Auth:      console.AuthNone,
		Loopback:  true,
		Operators: map[string][]console.Action{console.LocalUser: nil},
		Windows:   func(string) (time.Duration, time.Duration) { return window, window },
	})
	if err != nil {
		return err
	}
	// A day of the observe job's samples per tool, as serve leaves them
	// (one per tool per bucket), for the overview's charts.
	if _, err := b.db.Exec(ctx, `INSERT INTO stuck_samples (tool, at, stuck, in_flight)
		SELECT t.tool, date_bin($2::interval, now(), 'epoch'::timestamptz) - g * $2::interval, (g * 37) % 90, (g * 11) % 60
		FROM unnest($1::text[]) t(tool), generate_series(0, $3::int - 1) g
		ON CONFLICT (tool, at) DO NOTHING`, bigToolNames(), store.SampleEvery, int(24*time.Hour/store.SampleEvery)); err != nil {
		return fmt.Errorf("stuck samples: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (int, int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		if err != nil {
			return 0, 0, err
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, int(n), err
	}
	for _, p := range bigConsolePages {
		if p == bigCompletedKeyPage && b.layout == layoutTime {
			// In creation order bl-1234 is among the oldest keys, which
			// the purge batches delete: a completed charge_card key from
			// the middle of the period instead.
			p = fmt.Sprintf("/ui/key?key=bl-%d:charge_card", res.Keys/2/100*100+34)
		}
		pg := bigConsolePage{Path: p}
		if _, _, err := get(p); err != nil {
			return fmt.Errorf("console %s: %w", p, err)
		}
		for range b.reps {
			t0 := time.Now()
			status, n, err := get(p)
			if err != nil {
				return fmt.Errorf("console %s: %w", p, err)
			}
			pg.Seconds = append(pg.Seconds, round4(time.Since(t0).Seconds()))
			pg.Status, pg.Bytes = status, n
		}
		s := slices.Clone(pg.Seconds)
		slices.Sort(s)
		pg.Median, pg.Max = s[len(s)/2], s[len(s)-1]
		if pg.Status != http.StatusOK {
			return fmt.Errorf("console %s: status %d, want 200", p, pg.Status)
		}
		flag := ""
		if pg.Max > consoleBudget.Seconds() || pg.Bytes > consoleBudgetBytes {
			flag = "  OVER BUDGET (200 ms, 150 KB)"
		}
		b.logf("%d keys: console %-50s median %6.1f ms  max %6.1f ms  %6d bytes%s", res.Keys, p, pg.Median*1000, pg.Max*1000, pg.Bytes, flag)
		res.Console = append(res.Console, pg)
	}
	return nil
}

// runBigConsole measures the console's pages on a ledger built by
// `bigledger --database-url URL --keep`, without building it again: the
// operator population is rebuilt first (the reconcile pass decided it).
func runBigConsole(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lkbench bigconsole", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		dbURL   = fs.String("database-url", "", "the kept ledger: the server of `bigledger --keep`, database lkbench_bigledger (required)")
		reps    = fs.Int("reps", 5, "requests per page (after one unmeasured)")
		jsonOut = fs.String("json", "", "also write the results to this file as JSON")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" || *reps <= 0 {
		return errors.New("--database-url is required and --reps must be positive")
	}
	db, err := bigPool(ctx, *dbURL, true)
	if err != nil {
		return err
	}
	defer db.Close()
	b := &bigBench{db: db, reps: *reps, logf: logger(stderr)}
	res := bigSize{}
	if err := db.QueryRow(ctx, `SELECT reltuples::bigint FROM pg_class WHERE oid = 'idempotency_keys'::regclass`).Scan(&res.Keys); err != nil {
		return fmt.Errorf("no ledger there (run bigledger --keep first): %w", err)
	}
	if err := b.resetOperatorKeys(ctx); err != nil {
		return err
	}
	if err := b.measureConsole(ctx, &res); err != nil {
		return err
	}
	printBigConsole(stdout, []bigSize{res})
	if *jsonOut != "" {
		out, _ := json.MarshalIndent(res, "", "  ")
		return os.WriteFile(*jsonOut, out, 0o644)
	}
	return nil
}

// printBigConsole prints each console page's median and worst time and
// its weight per size.
func printBigConsole(w io.Writer, results []bigSize) {
	if len(results) == 0 || len(results[0].Console) == 0 {
		return
	}
	fmt.Fprintf(w, "\nconsole pages (median / max ms over %d requests, KB), budget %d ms and %d KB:\n", len(results[0].Console[0].Seconds), consoleBudget.Milliseconds(), consoleBudgetBytes>>10)
	for i, p := range results[0].Console {
		fmt.Fprintf(w, "  %-52s", p.Path)
		for _, r := range results {
			if i < len(r.Console) {
				c := r.Console[i]
				fmt.Fprintf(w, "  %s: %5.1f / %5.1f ms %5.1f KB", humanKeys(r.Keys), c.Median*1000, c.Max*1000, float64(c.Bytes)/1024)
			}
		}
		fmt.Fprintln(w)
	}
}
