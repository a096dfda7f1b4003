package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/conformance"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/exampletool"
	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const body = `{"title":"Printer on fire","account_id":"A-7"}`

// probeConfig is the demo's probe of create_ticket: GET /v1/tickets on the
// example tool's sink, match "data" (two tickets for one key → duplicate).
const probeConfig = `
tools:
  create_ticket:
    processing_window: 1s
    probe:
      type: http
      url: "${TOOL_URL}/v1/tickets?idempotency_key={key}"
      timeout: 3s
      match: "data"
      response_code: 201
      response_body: {ticket_id: "id", created_at: "created_at"}
retention:
  min_age: 24h
`

// buildProbe builds the tool's probe from a configuration file the way the
// daemon does.
func buildProbe(t *testing.T, toolURL string) probes.Probe {
	t.Helper()
	cfg, err := config.Parse("conformance.yaml", []byte(probeConfig), func(k string) (string, bool) {
		if k == "TOOL_URL" {
			return toolURL, true
		}
		return "", false
	})
	if err == nil {
		err = daemon.Settle(cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	built, closer, err := daemon.BuildProbes(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	return built[exampletool.Tool]
}

// world is a database with the example tool's sink and the example
// server's GET /v1/tickets (the probe's endpoint); post replaces its POST
// handler when a test brings a broken server.
type world struct {
	db   *pgtest.DB
	srv  *httptest.Server
	tool *exampletool.Server
}

func newWorld(t *testing.T, cfg exampletool.Config, post func(w *world) http.Handler) *world {
	t.Helper()
	w := &world{db: pgtest.New(t)}
	cfg.Ledger, cfg.Sink = w.db.Pool, w.db.Pool
	w.tool = exampletool.New(cfg)
	if err := w.tool.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := w.tool.Handler()
	if post != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /v1/tickets", h)
		mux.Handle("POST /tools/create_ticket", post(w))
		h = mux
	}
	w.srv = httptest.NewServer(h)
	t.Cleanup(w.srv.Close)
	return w
}

func (w *world) run(t *testing.T, mutate func(*conformance.Config)) conformance.Report {
	t.Helper()
	cfg := conformance.Config{
		URL: w.srv.URL + "/tools/create_ticket", Tool: exampletool.Tool, Probe: buildProbe(t, w.srv.URL),
		KeyPrefix: "conformance-test:", Body: json.RawMessage(body), Timeout: 10 * time.Second, Settle: 20 * time.Second,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	rep, err := conformance.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = conformance.Print(&out, rep)
	t.Logf("conformance:\n%s", out.String())
	return rep
}

func failed(rep conformance.Report) []string {
	var names []string
	for _, a := range rep.Assertions {
		if a.Status == conformance.Fail {
			names = append(names, a.Name)
		}
	}
	return names
}

func wantFailed(t *testing.T, rep conformance.Report, names ...string) {
	t.Helper()
	got := failed(rep)
	for _, n := range names {
		found := false
		for _, g := range got {
			found = found || g == n
		}
		if !found {
			t.Errorf("assertion %q did not fail; failed: %q", n, got)
		}
	}
}

// tickets counts the sink's effects for one key: what the probe counts.
func (w *world) tickets(t *testing.T, key string) int {
	t.Helper()
	var n int
	if err := w.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM tickets WHERE idempotency_key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The example tool server passes every assertion, the client deadline
// included when a slow path is named (its processing time is 1s here,
// the client deadline 100ms).
func TestExampleToolPasses(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{Delay: time.Second}, nil)
	rep := w.run(t, func(c *conformance.Config) {
		c.SlowBody = json.RawMessage(`{"title":"slow","account_id":"A-8"}`)
		c.SlowDeadline = 100 * time.Millisecond
	})
	if !rep.OK() || rep.Skipped != 0 || rep.Passed < 15 {
		t.Fatalf("the example tool server should pass everything: %+v", rep)
	}
	for _, k := range []string{"same-key-twice", "other-arguments", "concurrent", "client-deadline"} {
		if n := w.tickets(t, "conformance-test:"+k); n != 1 {
			t.Errorf("sink holds %d tickets for %s, want 1", n, k)
		}
	}
	if n := w.tickets(t, "conformance-test:probe-control"); n != 0 {
		t.Errorf("probe-control left %d tickets", n)
	}
}

// Without a slow path the client deadline is skipped with its reason, and
// --allow-missing-key skips the 400 check.
func TestSkipsWithReason(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, nil)
	rep := w.run(t, func(c *conformance.Config) { c.AllowMissingKey = true; c.Concurrency = 5 })
	if !rep.OK() || rep.Skipped != 2 {
		t.Fatalf("report: %+v", rep)
	}
	for _, a := range rep.Assertions {
		if a.Status == conformance.Skip && a.Name == "client-deadline/the retry after a client deadline gets 409, never a second effect" &&
			!strings.Contains(a.Seen, "--slow-body") {
			t.Errorf("skip without its reason: %+v", a)
		}
	}
}

// (a) A claim by SELECT then INSERT, no unique constraint: two concurrent
// requests both see no row and both execute. A gate holds the first miss of
// the concurrent key until a second request has missed too, so the race
// happens on every run.
func TestCatchesSelectThenInsert(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
		if _, err := w.db.Pool.Exec(context.Background(), `CREATE TABLE naive_keys (key text NOT NULL, request text NOT NULL, response text)`); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		misses := 0
		both := make(chan struct{})
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			key := r.Header.Get("Idempotency-Key")
			req, _ := io.ReadAll(r.Body)
			if key == "" {
				http.Error(rw, `{"error":"missing key"}`, http.StatusBadRequest)
				return
			}
			var stored string
			var resp *string
			err := w.db.Pool.QueryRow(ctx, `SELECT request, response FROM naive_keys WHERE key = $1 LIMIT 1`, key).Scan(&stored, &resp)
			switch {
			case err == nil && stored != string(req):
				rw.WriteHeader(http.StatusUnprocessableEntity)
				return
			case err == nil && resp == nil:
				rw.WriteHeader(http.StatusConflict)
				return
			case err == nil:
				rw.Header().Set("Idempotency-Replayed", "true")
				rw.WriteHeader(http.StatusCreated)
				fmt.Fprintf(rw, `{"ok":true,"idempotent_replay":true,"original_response":%s}`, *resp)
				return
			case !errors.Is(err, pgx.ErrNoRows):
				rw.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			if strings.HasSuffix(key, "concurrent") {
				mu.Lock()
				misses++
				if misses == 2 {
					close(both)
				}
				mu.Unlock()
				select {
				case <-both:
				case <-time.After(10 * time.Second): // a bound, not a synchronisation
				}
			}
			if _, err := w.db.Pool.Exec(ctx, `INSERT INTO naive_keys (key, request) VALUES ($1, $2)`, key, string(req)); err != nil {
				rw.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			var id string
			if err := w.db.Pool.QueryRow(ctx, `INSERT INTO tickets (idempotency_key, title, account_id) VALUES ($1, 't', 'a') RETURNING ticket_id`, key).Scan(&id); err != nil {
				rw.WriteHeader(http.StatusInternalServerError)
				return
			}
			out := fmt.Sprintf(`{"ticket_id":%q}`, id)
			_, _ = w.db.Pool.Exec(ctx, `UPDATE naive_keys SET response = $2 WHERE key = $1`, key, out)
			rw.WriteHeader(http.StatusCreated)
			fmt.Fprintf(rw, `{"ok":true,"idempotent_replay":false,"original_response":%s}`, out)
		})
	})
	rep := w.run(t, nil)
	wantFailed(t, rep, "concurrent/exactly one effect", "concurrent/exactly one request executed")
	if n := w.tickets(t, "conformance-test:concurrent"); n < 2 {
		t.Fatalf("the broken server should have double-executed: %d tickets", n)
	}
	if got := failed(rep); len(got) != 2 {
		t.Errorf("only the concurrency assertions should fail, failed: %q", got)
	}
}

// (b) A server that stores every outcome, a 500 included, and replays it:
// the sink fails after the ticket is written (the effect exists), and the
// 500 is then replayed instead of the key being left for the reconciler.
func TestCatchesCached500(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
		var mu sync.Mutex
		stored := map[string][]byte{}
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			key := r.Header.Get("Idempotency-Key")
			if key == "" {
				rw.WriteHeader(http.StatusBadRequest)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if b, ok := stored[key]; ok {
				rw.Header().Set("Idempotency-Replayed", "true")
				rw.WriteHeader(http.StatusInternalServerError)
				fmt.Fprintf(rw, `{"ok":false,"idempotent_replay":true,"original_response":%s}`, b)
				return
			}
			if _, err := w.db.Pool.Exec(r.Context(), `INSERT INTO tickets (idempotency_key, title, account_id) VALUES ($1, 't', 'a')`, key); err != nil {
				rw.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			stored[key] = []byte(`{"error":"ticket store timed out"}`)
			rw.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(rw, `{"ok":false,"idempotent_replay":false,"original_response":%s}`, stored[key])
		})
	})
	rep := w.run(t, func(c *conformance.Config) { c.Concurrency = 5 })
	wantFailed(t, rep, "no-cached-5xx/a 5xx is never stored and replayed", "same-key-twice/first answer 2xx, not a replay")
}

// (c) A server whose ledger ignores the fingerprint: it remembers the first
// arguments of each key and hands them to the (real) middleware in place of
// the request's own, so other arguments get the first call's replay.
func TestCatchesIgnoredFingerprint(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
		real := w.tool.Handler()
		var mu sync.Mutex
		first := map[string][]byte{}
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			if key := r.Header.Get("Idempotency-Key"); key != "" {
				mu.Lock()
				if f, ok := first[key]; ok {
					b = f
				} else {
					first[key] = b
				}
				mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			r.ContentLength = int64(len(b))
			real.ServeHTTP(rw, r)
		})
	})
	rep := w.run(t, func(c *conformance.Config) { c.Concurrency = 5 })
	wantFailed(t, rep, "other-arguments/the key with other arguments gets 422")
	if got := failed(rep); len(got) != 1 {
		t.Errorf("only the fingerprint assertion should fail, failed: %q", got)
	}
}

// A configuration the battery cannot run with is an error, not a report.
func TestValidate(t *testing.T) {
	t.Parallel()
	_, err := conformance.Run(context.Background(), conformance.Config{URL: "http://x", Tool: "t",
		Probe: probes.ProbeFunc(func(context.Context, probes.Key) probes.Result { return probes.Result{} }), Body: json.RawMessage(`[1]`)})
	if err == nil || !strings.Contains(err.Error(), "--other-body") {
		t.Fatalf("err = %v", err)
	}
}
