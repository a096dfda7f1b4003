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
	return buildProbeFrom(t, probeConfig, toolURL)
}

// buildProbeFrom builds create_ticket's probe from a configuration, with
// TOOL_URL set to toolURL.
func buildProbeFrom(t *testing.T, yaml, toolURL string) probes.Probe {
	t.Helper()
	cfg, err := config.Parse("conformance.yaml", []byte(yaml), func(k string) (string, bool) {
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

// onlyFailed asserts that exactly the named assertions failed.
func onlyFailed(t *testing.T, rep conformance.Report, names ...string) {
	t.Helper()
	wantFailed(t, rep, names...)
	if got := failed(rep); len(got) != len(names) {
		t.Errorf("want exactly %d failures %q, failed: %q", len(names), names, got)
	}
}

func status(rep conformance.Report, name string) string {
	for _, a := range rep.Assertions {
		if a.Name == name {
			return a.Status
		}
	}
	return "absent"
}

// failTitle makes the sink refuse a ticket titled title, so the example
// tool answers it with a 500 (ticket store unavailable).
func failTitle(t *testing.T, w *world, title string) {
	t.Helper()
	if _, err := w.db.Pool.Exec(context.Background(), `CREATE FUNCTION refuse_title() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.title = '`+title+`' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_title BEFORE INSERT ON tickets FOR EACH ROW EXECUTE FUNCTION refuse_title()`); err != nil {
		t.Fatal(err)
	}
}

// The example tool server (ledger.Middleware) passes the default profile,
// draft-07, keys sent as Structured Field Strings: the middleware reads the
// quoted key's value (ledger.ParseKeyHeader), so the effects are found under
// the bare key and key-format passes.
func TestExampleToolPassesDraft07(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, nil)
	failTitle(t, w, "fail")
	rep := w.run(t, func(c *conformance.Config) {
		c.FailBody = json.RawMessage(`{"title":"fail","account_id":"A-9"}`)
	})
	if !rep.OK() || rep.Profile != conformance.ProfileDraft07 || rep.KeyFormat != conformance.KeyFormatSFString {
		for _, a := range rep.Assertions {
			if a.Status != conformance.Pass {
				t.Logf("%s %s: %s", a.Status, a.Name, a.Seen)
			}
		}
		t.Fatalf("the example tool server should pass draft-07: %+v", rep)
	}
	for _, k := range []string{"same-key-twice", "other-arguments", "concurrent"} {
		if n := w.tickets(t, "conformance-test:"+k); n != 1 {
			t.Errorf("sink holds %d tickets for %s under the unquoted key, want 1", n, k)
		}
	}
}

// The example tool server (ledger.Middleware) passes every assertion of
// the ledgerkeeper profile, its markers included, the client deadline and
// the deliberate 5xx too (a title the sink refuses: the middleware stores
// nothing, and the retry gets 409).
func TestExampleToolPassesLedgerkeeperProfile(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{Delay: time.Second}, nil)
	failTitle(t, w, "fail")
	rep := w.run(t, func(c *conformance.Config) {
		c.Profile = conformance.ProfileLedgerkeeper
		c.SlowBody = json.RawMessage(`{"title":"slow","account_id":"A-8"}`)
		c.SlowDeadline = 100 * time.Millisecond
		c.FailBody = json.RawMessage(`{"title":"fail","account_id":"A-9"}`)
	})
	if !rep.OK() || rep.Skipped != 0 || rep.Passed < 20 || rep.KeyFormat != conformance.KeyFormatRaw {
		t.Fatalf("the example tool server should pass everything: %+v", rep)
	}
	markers := 0
	for _, a := range rep.Assertions {
		if strings.HasPrefix(a.Name, "ledgerkeeper/") {
			markers++
		}
	}
	if markers < 6 {
		t.Errorf("the ledgerkeeper profile ran %d marker assertions, want its set", markers)
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

// A draft-07 server that is not ours (draftServer: its own store, no
// markers, sf-string keys) passes the default profile, every scenario run;
// the sink holds one ticket per scenario key. Under the ledgerkeeper
// profile only the marker assertions fail: the profiles are separate.
func TestDraftServerPassesDraft07(t *testing.T) {
	t.Parallel()
	var srv *draftServer
	w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
		srv = &draftServer{sink: w.db.Pool, slow: time.Second, keys: map[string]*draftEntry{}}
		return srv
	})
	all := func(c *conformance.Config) {
		c.SlowBody = json.RawMessage(`{"title":"slow","account_id":"A-8"}`)
		c.SlowDeadline = 100 * time.Millisecond
		c.FailBody = json.RawMessage(`{"title":"fail","account_id":"A-9"}`)
	}
	rep := w.run(t, all)
	if !rep.OK() || rep.Skipped != 0 || rep.Profile != conformance.ProfileDraft07 || rep.KeyFormat != conformance.KeyFormatSFString {
		t.Fatalf("a draft-07 server should pass the default profile: failed %q\n%+v", failed(rep), rep)
	}
	if st := status(rep, "key-format/the key is read as the Structured Field String's value, without its quotes"); st != conformance.Pass {
		t.Errorf("key-format: %s", st)
	}
	for _, k := range []string{"same-key-twice", "other-arguments", "concurrent", "client-deadline"} {
		if n := w.tickets(t, "conformance-test:"+k); n != 1 {
			t.Errorf("sink holds %d tickets for %s, want 1", n, k)
		}
	}
	rep = w.run(t, func(c *conformance.Config) {
		all(c)
		c.Profile, c.KeyFormat, c.KeyPrefix = conformance.ProfileLedgerkeeper, conformance.KeyFormatSFString, "lk-profile:"
	})
	got := failed(rep)
	if len(got) == 0 {
		t.Fatal("the ledgerkeeper profile should fail a server without ledgerkeeper's markers")
	}
	for _, n := range got {
		if !strings.HasPrefix(n, "ledgerkeeper/") {
			t.Errorf("under the ledgerkeeper profile, a contract assertion failed: %q", n)
		}
	}
}

// A server that takes the header's bytes as the key stores "\"k\"" for the
// sf-string "k": key-format fails, once, and the rest of the battery still
// judges the contract under the quoted key; with --key-format raw it
// passes.
func TestCatchesQuotesKeptInTheKey(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
		return &draftServer{sink: w.db.Pool, rawKeys: true, keys: map[string]*draftEntry{}}
	})
	rep := w.run(t, func(c *conformance.Config) { c.Concurrency = 5 })
	onlyFailed(t, rep, "key-format/the key is read as the Structured Field String's value, without its quotes")
	if n := w.tickets(t, `"conformance-test:same-key-twice"`); n != 1 {
		t.Errorf("sink holds %d tickets under the quoted key, want 1", n)
	}
	rep = w.run(t, func(c *conformance.Config) {
		c.Concurrency = 5
		c.KeyFormat = conformance.KeyFormatRaw
		c.KeyPrefix = "raw:"
	})
	if !rep.OK() {
		t.Fatalf("with raw keys the server conforms: failed %q", failed(rep))
	}
}

// Without a slow path the client deadline is skipped with its reason,
// without a failing request no-cached-5xx is, and --allow-missing-key
// skips the 400 check.
func TestSkipsWithReason(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, nil)
	rep := w.run(t, func(c *conformance.Config) {
		c.AllowMissingKey = true
		c.Concurrency = 5
		c.KeyFormat = conformance.KeyFormatRaw
	})
	if !rep.OK() || rep.Skipped != 3 {
		t.Fatalf("report: %+v", rep)
	}
	reasons := map[string]string{
		"client-deadline/the retry after a client deadline gets 409, never a second effect": "--slow-body",
		"no-cached-5xx/the retry after a 5xx is not that 5xx replayed":                      "--fail-body",
		"missing-key/a request without Idempotency-Key gets 400":                            "--allow-missing-key",
	}
	for _, a := range rep.Assertions {
		if a.Status == conformance.Skip && !strings.Contains(a.Seen, reasons[a.Name]) || reasons[a.Name] == "" && a.Status == conformance.Skip {
			t.Errorf("skip without its reason: %+v", a)
		}
	}
}

// (a) A claim by SELECT then INSERT, no unique constraint: two concurrent
// requests both see no row and both execute. A gate holds the first miss of
// the concurrent key until a second request has missed too, so the race
// happens on every run. It replays by status and body, with no marker.
func TestCatchesSelectThenInsert(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
		if _, err := w.db.Pool.Exec(context.Background(), `CREATE TABLE naive_keys (key text NOT NULL, request text NOT NULL, code int, response text)`); err != nil {
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
				rw.WriteHeader(http.StatusCreated)
				fmt.Fprint(rw, *resp)
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
			fmt.Fprint(rw, out)
		})
	})
	rep := w.run(t, func(c *conformance.Config) { c.KeyFormat = conformance.KeyFormatRaw })
	if n := w.tickets(t, "conformance-test:concurrent"); n < 2 {
		t.Fatalf("the broken server should have double-executed: %d tickets", n)
	}
	onlyFailed(t, rep, "concurrent/exactly one request executed", "concurrent/the answers 2xx are one answer and its replays")
}

// (b) A server that stores every outcome, a 5xx included, and replays it:
// no-cached-5xx fails, and only it. When its 5xx is the same for every
// request (no error id), a replay cannot be told from a second failure:
// skipped with that reason, never passed.
func TestCatchesCached5xx(t *testing.T) {
	t.Parallel()
	const name = "no-cached-5xx/the retry after a 5xx is not that 5xx replayed"
	for _, fixed := range []bool{false, true} {
		w := newWorld(t, exampletool.Config{}, func(w *world) http.Handler {
			return &draftServer{sink: w.db.Pool, cache5xx: true, fixed5xx: fixed, keys: map[string]*draftEntry{}}
		})
		rep := w.run(t, func(c *conformance.Config) {
			c.Concurrency = 5
			c.FailBody = json.RawMessage(`{"title":"fail","account_id":"A-9"}`)
		})
		if !fixed {
			onlyFailed(t, rep, name)
			continue
		}
		if !rep.OK() || status(rep, name) != conformance.Skip {
			t.Errorf("a cached 5xx that is the same for every request: want %s skipped, got %s; failed %q", name, status(rep, name), failed(rep))
		}
	}
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
	rep := w.run(t, func(c *conformance.Config) { c.Concurrency = 5; c.KeyFormat = conformance.KeyFormatRaw })
	onlyFailed(t, rep, "other-arguments/the key with other arguments gets 422")
}

// A dead URL, a wrong one (404) and a probe that cannot answer stop the run
// before the battery: an error wrapping ErrNotReached, no assertion.
func TestStopsWhenNothingCanBeJudged(t *testing.T) {
	t.Parallel()
	w := newWorld(t, exampletool.Config{}, nil)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	unknown := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
		return probes.Result{Verdict: probes.Unknown, Err: errors.New("sink unreachable")}
	})
	for _, c := range []struct {
		name, url string
		probe     probes.Probe
		want      string
	}{
		{"dead URL", deadURL + "/tools/create_ticket", nil, "cannot reach the tool endpoint"},
		{"wrong URL", w.srv.URL + "/tools/create_tickets", nil, "answered 404 Not Found"},
		{"wrong method", w.srv.URL + "/v1/tickets", nil, "answered 405 Method Not Allowed"},
		{"dead probe", w.srv.URL + "/tools/create_ticket", unknown, "sink unreachable"},
	} {
		probe := c.probe
		if probe == nil {
			probe = buildProbe(t, w.srv.URL)
		}
		rep, err := conformance.Run(context.Background(), conformance.Config{URL: c.url, Tool: exampletool.Tool, Probe: probe,
			KeyPrefix: "stop:" + c.name + ":", Body: json.RawMessage(body), KeyFormat: conformance.KeyFormatRaw, Timeout: 5 * time.Second})
		if !errors.Is(err, conformance.ErrNotReached) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || len(rep.Assertions) != 0 {
			t.Errorf("%s: err = %v, %d assertions; want one line with %q wrapping ErrNotReached, no assertion", c.name, err, len(rep.Assertions), c.want)
		}
	}
}

// A configuration the battery cannot run with is an error, not a report.
func TestValidate(t *testing.T) {
	t.Parallel()
	probe := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result { return probes.Result{} })
	for _, c := range []struct {
		cfg  conformance.Config
		want string
	}{
		{conformance.Config{URL: "http://x", Tool: "t", Probe: probe, Body: json.RawMessage(`[1]`)}, "--other-body"},
		{conformance.Config{URL: "http://x", Tool: "t", Probe: probe, Body: json.RawMessage(body), Profile: "draft-06"}, `profile "draft-06"`},
		{conformance.Config{URL: "http://x", Tool: "t", Probe: probe, Body: json.RawMessage(body), KeyFormat: "token"}, `key format "token"`},
		{conformance.Config{URL: "http://x", Tool: "t", Probe: probe, Body: json.RawMessage(body), KeyPrefix: "a\nb"}, "not printable ASCII"},
		{conformance.Config{URL: "http://x", Tool: "t", Probe: probe, Body: json.RawMessage(body), FailBody: json.RawMessage(`{`)}, "fail body: not valid JSON"},
	} {
		_, err := conformance.Run(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want %q", err, c.want)
		}
	}
}

// Print keeps one line per assertion whatever the evidence holds: a body
// or an error with newlines is escaped.
func TestPrintOneLinePerAssertion(t *testing.T) {
	t.Parallel()
	rep := conformance.Report{Profile: conformance.ProfileDraft07, KeyFormat: conformance.KeyFormatSFString, KeyPrefix: "p:",
		Assertions: []conformance.Assertion{{Status: conformance.Fail, Name: "a/b", Seen: "no answer: line one\nline two"}}, Failed: 1}
	var out bytes.Buffer
	if err := conformance.Print(&out, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || lines[0] != `FAIL a/b: no answer: line one\nline two` || !strings.Contains(lines[1], "profile draft-07, keys sf-string") {
		t.Fatalf("output:\n%s", out.String())
	}
}
