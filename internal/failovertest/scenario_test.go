package failovertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// bin is the ledgerkeeper binary the scenarios run, built once.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "failovertest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "ledgerkeeper")
	build := exec.Command("go", "build", "-o", bin, "./cmd/ledgerkeeper")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/ledgerkeeper: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// sink is the downstream of the tool: POST creates a ticket for a key (the
// effect, counted), GET answers the reconciler's probe.
type sink struct {
	srv     *httptest.Server
	mu      sync.Mutex
	tickets map[string]int
}

func newSink(t *testing.T) *sink {
	s := &sink{tickets: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("idempotency_key")
		s.mu.Lock()
		defer s.mu.Unlock()
		if r.Method == http.MethodPost {
			s.tickets[key]++
		}
		data := []map[string]any{}
		for i := range s.tickets[key] {
			data = append(data, map[string]any{"id": fmt.Sprintf("T-%s-%d", key, i), "created_at": "2026-12-01T00:00:00Z"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) set(key string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tickets[key] = n
}

func (s *sink) all() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, n := range s.tickets {
		out[k] = n
	}
	return out
}

// syncBuffer is serve's stderr, read while it writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// serveProc is a running `ledgerkeeper serve`.
type serveProc struct {
	cmd    *exec.Cmd
	stderr syncBuffer
	exited chan struct{}
	addr   string
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// const window and grace: a key is due 3 s after its claim.
const (
	window = 2 * time.Second
	grace  = time.Second
)

func startServe(t *testing.T, url string, s *sink) *serveProc {
	t.Helper()
	addr := freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "ledgerkeeper.yaml")
	body := fmt.Sprintf(`log:
  format: json
schedule:
  reconcile: "@every 1s"
  purge: "@every 2s"
  alerts: "@every 1s"
reconcile:
  grace: %s
tools:
  create_ticket:
    processing_window: %s
    probe:
      type: http
      url: "%s/v1/tickets?idempotency_key={key}"
      match: data
      response_code: 201
      response_body: {ticket_id: id}
http:
  listen: "%s"
`, grace, window, s.srv.URL, addr)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &serveProc{addr: addr, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "serve", "--config", cfg, "--database-url", url) //nolint:noctx // stopped by SIGTERM below
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		testwait.Recv(t, p.exited, 60*time.Second)
		if t.Failed() {
			t.Logf("serve's stderr (end):\n%s", tail(p.stderr.String(), 60))
		}
	})
	testwait.Eventually(t, func() bool { return p.get("/readyz") == http.StatusOK }, 60*time.Second, "serve to be ready")
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *serveProc) get(path string) int {
	resp, err := http.Get("http://" + p.addr + path) //nolint:noctx // a local probe
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// metric reads one series' value from serve's /metrics (-1: absent).
func (p *serveProc) metric(series string) float64 {
	resp, err := http.Get("http://" + p.addr + "/metrics") //nolint:noctx // a local scrape
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

func (p *serveProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// logLines are serve's JSON log lines whose message is msg, or starts
// with msg and a colon.
func (p *serveProc) logLines(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && (m["msg"] == msg || strings.HasPrefix(fmt.Sprint(m["msg"]), msg+":")) {
			out = append(out, m)
		}
	}
	return out
}

// admin reads and writes the ledger on a fresh connection each time, to
// the host of the URL that takes writes now: never a pooled connection
// left on an old primary.
type admin struct{ url string }

func (a admin) scan(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, a.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if len(dest) == 0 {
		_, err = conn.Exec(ctx, sql, args...)
		return err
	}
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// must is scan for after the failover: retried until a writable primary
// answers.
func (a admin) must(t *testing.T, sql string, args []any, dest ...any) {
	t.Helper()
	retrying(t, sql, func(ctx context.Context) error { return a.scan(ctx, sql, args, dest...) })
}

// migrate runs `ledgerkeeper migrate` on url.
func migrate(t *testing.T, url string) {
	t.Helper()
	// Retried: a database just created on the primary may not be on the
	// standby yet, and a node that refuses a connection with a server
	// error (no such database) ends pgx's tour of the hosts.
	var out []byte
	retrying(t, "ledgerkeeper migrate", func(ctx context.Context) error {
		var err error
		out, err = exec.CommandContext(ctx, bin, "migrate", "--database-url", url).CombinedOutput()
		return err
	})
	_ = out
}

// retrying runs f until it succeeds: a write across a failover.
func retrying(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	var last error
	testwait.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		last = f(ctx)
		return last == nil
	}, 90*time.Second, what)
	_ = last
}

// stuck inserts processing keys whose window plus grace ends dueIn from
// now, with their tickets at the sink (the effect happened; the tool
// server died before Complete): the reconciler must complete each once.
func stuck(t *testing.T, db admin, s *sink, prefix string, n int, dueIn time.Duration) []string {
	t.Helper()
	var keys []string
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		keys = append(keys, key)
		s.set(key, 1)
		db.must(t, `INSERT INTO idempotency_keys (key, tool, request_hash, created_at, claimed_at, expires_at)
			VALUES ($1, 'create_ticket', 'h', now() - $2::interval, now() - $2::interval, now() + interval '1 day')
			ON CONFLICT (key) DO NOTHING`, []any{key, window + grace - dueIn})
	}
	return keys
}

// toolServer is a tool server behind ledger.Middleware on a pool that
// follows the primary; its effect is a ticket at the sink.
func toolServer(t *testing.T, url string, s *sink) *httptest.Server {
	t.Helper()
	pool, _, err := ledger.NewPool(context.Background(), url, ledger.FollowOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tool := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := ledger.AttemptFromContext(r.Context())
		resp, err := http.Post(s.srv.URL+"/v1/tickets?idempotency_key="+a.Key, "application/json", nil) //nolint:noctx // the effect
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"ticket_id":"T-%s-0"}`, a.Key)
	})
	srv := httptest.NewServer(ledger.Middleware(ledger.MiddlewareConfig{DB: pool, Tool: "create_ticket", RetryAfter: time.Second}, tool))
	t.Cleanup(srv.Close)
	return srv
}

// load sends rate new calls per second to the tool server for d, each
// retried with its key (503, 409) until a definitive answer or until the
// retry deadline; it returns the keys acknowledged (201) and all keys.
type load struct {
	mu    sync.Mutex
	acked map[string]bool
	keys  []string
	wg    sync.WaitGroup
	n503  atomic.Int64
	n409  atomic.Int64
}

func startLoad(srvURL, prefix string, rate int, d, retryFor time.Duration) *load {
	l := &load{acked: map[string]bool{}}
	client := &http.Client{Timeout: 10 * time.Second}
	l.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		end := time.Now().Add(d)
		for i := 0; time.Now().Before(end); i++ {
			<-tick.C
			key := fmt.Sprintf("%s-%d", prefix, i)
			l.mu.Lock()
			l.keys = append(l.keys, key)
			l.mu.Unlock()
			l.wg.Go(func() {
				deadline := time.Now().Add(retryFor)
				for time.Now().Before(deadline) {
					req, _ := http.NewRequest(http.MethodPost, srvURL, strings.NewReader(`{"title":"failover"}`)) //nolint:noctx // bounded by the client's timeout
					req.Header.Set(ledger.HeaderIdempotencyKey, key)
					resp, err := client.Do(req)
					code := 0
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					switch code {
					case http.StatusCreated:
						l.mu.Lock()
						l.acked[key] = true
						l.mu.Unlock()
						return
					case http.StatusServiceUnavailable:
						l.n503.Add(1)
					case http.StatusConflict:
						l.n409.Add(1)
					}
					time.Sleep(200 * time.Millisecond) // the client's back-off between retries
				}
			})
		}
	})
	return l
}

// scenario is one failover under serve and a tool server.
type scenario struct {
	name string
	// url of the ledger database, all hosts.
	url string
	// failover makes it fail over and returns when it is done.
	failover func(ctx context.Context) error
}

// run: stuck keys due before, during and after the failover; a tool
// server taking 50 calls/s through it; then every assertion.
func (sc scenario) run(t *testing.T) {
	s := newSink(t)
	migrate(t, sc.url)
	db := admin{url: sc.url}
	var keys []string
	keys = append(keys, stuck(t, db, s, "before", 5, 0)...)
	srv := startServe(t, sc.url, s)
	tool := toolServer(t, sc.url, s)
	ld := startLoad(tool.URL, "call", 50, 12*time.Second, 60*time.Second)
	keys = append(keys, stuck(t, db, s, "during", 5, 3*time.Second)...)
	// The failover comes once the load is running.
	testwait.Eventually(t, func() bool {
		ld.mu.Lock()
		defer ld.mu.Unlock()
		return len(ld.acked) >= 100
	}, 30*time.Second, "the tool server to acknowledge 100 calls")
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := sc.failover(ctx); err != nil {
		t.Fatalf("failover: %v", err)
	}
	failedOver := time.Since(t0)
	const purgeOK = `ledgerkeeper_job_runs_total{result="ok",task="purge"}`
	purgesBefore := srv.metric(purgeOK)
	keys = append(keys, stuck(t, db, s, "after", 5, 0)...)

	// Every stuck key decided, and decided right.
	testwait.Eventually(t, func() bool {
		var n int
		err := db.scan(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = ANY($1) AND status = 'completed'`, []any{keys}, &n)
		return err == nil && n == len(keys)
	}, 90*time.Second, "every stuck key completed by serve")
	testwait.Wait(t, &ld.wg, 2*time.Minute)

	var firstDecision time.Time
	db.must(t, `SELECT min(created_at) FROM reconcile_audit WHERE created_at >= $1`, []any{t0}, &firstDecision)
	for _, k := range keys {
		var code int
		var body string
		db.must(t, `SELECT response_code, response_body::text FROM idempotency_keys WHERE key = $1`, []any{k}, &code, &body)
		if code != http.StatusCreated || !strings.Contains(body, "T-"+k+"-0") {
			t.Errorf("%s: decided %d %s, want 201 with its ticket", k, code, body)
		}
	}
	// Every decision in the logs is in the audit, once.
	resolved := srv.logLines("key resolved")
	logged := map[string]int{}
	for _, l := range resolved {
		key, _ := l["key"].(string)
		logged[key]++
		var n int
		db.must(t, `SELECT count(*) FROM reconcile_audit WHERE key = $1 AND action = $2`, []any{key, l["action"]}, &n)
		if n != 1 {
			t.Errorf("%s: logged as %v, %d audit rows with that action, want 1", key, l["action"], n)
		}
	}
	for k, n := range logged {
		if n != 1 {
			t.Errorf("%s: %d 'key resolved' lines, want 1", k, n)
		}
	}
	for _, k := range keys {
		if logged[k] != 1 {
			t.Errorf("%s: no 'key resolved' line", k)
		}
	}

	// Every acknowledged call's outcome in the ledger; every effect at the
	// sink once.
	ld.mu.Lock()
	acked, calls := len(ld.acked), len(ld.keys)
	for key := range ld.acked {
		var status string
		var code *int
		if err := db.scan(context.Background(), `SELECT status, response_code FROM idempotency_keys WHERE key = $1`, []any{key}, &status, &code); err != nil {
			t.Errorf("acknowledged call %s: %v", key, err)
			continue
		}
		if status != ledger.StatusCompleted && status != ledger.StatusProcessing {
			t.Errorf("acknowledged call %s: status %s", key, status)
		}
	}
	ld.mu.Unlock()
	testwait.Eventually(t, func() bool {
		var n int
		err := db.scan(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key LIKE 'call-%' AND status = 'processing'`, nil, &n)
		return err == nil && n == 0
	}, 60*time.Second, "the calls whose Complete was cut to be completed by the reconciler")
	for key, n := range s.all() {
		if n != 1 {
			t.Errorf("%s: %d effects at the sink, want 1", key, n)
		}
	}
	if acked < calls*9/10 {
		t.Errorf("only %d of %d calls acknowledged within their retries", acked, calls)
	}

	// Purge takes its session advisory lock again on the new primary.
	testwait.Eventually(t, func() bool { return srv.metric(purgeOK) > purgesBefore }, 30*time.Second,
		"a purge pass to succeed after the failover")
	if w := srv.metric("ledgerkeeper_database_writable"); w != 1 {
		t.Errorf("ledgerkeeper_database_writable = %v after recovery, want 1", w)
	}
	if srv.get("/readyz") != http.StatusOK {
		t.Error("/readyz is not 200 after recovery")
	}

	// serve never restarted; the failover logged once, not per statement.
	if !srv.running() {
		t.Fatal("serve exited")
	}
	if n := len(srv.logLines("ledgerkeeper serving")); n != 1 {
		t.Errorf("serve started %d times, want 1", n)
	}
	fo, jobFailed := len(srv.logLines("database failed over")), len(srv.logLines("job failed"))
	if fo < 1 || fo > 2 {
		t.Errorf("%d 'database failed over' lines for one failover, want one (two at most: the old node, then a new one that was not ready)", fo)
	}
	t.Logf("failover-timing scenario=%q failover_command=%v first_decision_after=%v calls=%d acknowledged=%d answers_503=%d answers_409=%d failover_lines=%d job_failed_lines=%d",
		sc.name, failedOver.Round(10*time.Millisecond), firstDecision.Sub(t0).Round(10*time.Millisecond), calls, acked, ld.n503.Load(), ld.n409.Load(), fo, jobFailed)
}

// createDB creates database name through url (the primary).
func createDB(t *testing.T, url, name string) {
	t.Helper()
	retrying(t, "create database "+name, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		return err
	})
}
