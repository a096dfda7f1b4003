package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/exampletool"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

//go:embed demo.yaml
var demoConfig []byte

func newDemoCmd(a *app) *cobra.Command {
	var printConfig bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole loop on an embedded default, for a newcomer",
		Long: `Run the whole loop once, end to end, on real parts:

  - a throwaway PostgreSQL (from the local PostgreSQL binaries) unless
    --database-url or $LEDGERKEEPER_DATABASE_URL names a server, in which
    case a scratch database is created there and dropped afterwards;
  - the example create_ticket tool server behind ledger.Middleware;
  - tool calls that succeed, crash after their effect, crash before it,
    hit a tool without a probe, and find a duplicate downstream;
  - one reconcile pass with the http probe, the retries that follow, and
    the Slack alerts, posted to a local stand-in for Slack and printed;
  - one Slack action end to end: the stand-in clicks "Mark retryable" on
    an alert (as a user not allowed, then as the operator) with a signed
    request to /slack/interactions, and the key's row and audit follow.

Nothing outside the scratch database is touched.`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if printConfig {
				_, err := a.stdout.Write(demoConfig)
				return err
			}
			return runDemo(cmd.Context(), a)
		},
	}
	cmd.Flags().BoolVar(&printConfig, "print-config", false, "print the demo's configuration and exit")
	return cmd
}

type demo struct {
	a       *app
	out     io.Writer
	pool    *pgxpool.Pool
	tool    *http.Server
	toolURL string
	slack   *fakeSlack
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

func runDemo(ctx context.Context, a *app) error {
	if err := a.load(); err != nil {
		return err
	}
	d := &demo{a: a, out: a.stdout}
	// The demo's own configuration; log output stays quiet unless asked.
	if a.logLevel == "" {
		a.logger = newLogger(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), a.redactor())
	}

	d.say("== ledgerkeeper demo ==")
	url, cleanup, err := d.database(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	pool, err := connect(ctx, url, 20)
	if err != nil {
		return err
	}
	defer pool.Close()
	d.pool = pool
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		return err
	}
	d.say("schema migrated.")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// Keys whose handler "dies" after its effect; read by the server's
	// goroutines, changed by the demo's.
	var crash sync.Map
	crash.Store("wf-2:step-1:create_ticket", true)
	tool := exampletool.New(exampletool.Config{Ledger: pool, Sink: pool, Logger: a.logger, AfterEffect: func(key string) {
		if _, ok := crash.Load(key); ok {
			panic(http.ErrAbortHandler) // the process "dies" after the effect
		}
	}})
	if err := tool.Migrate(ctx); err != nil {
		return err
	}
	d.tool = &http.Server{Handler: tool.Handler(), ErrorLog: nil, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.tool.Serve(ln) }()
	defer d.tool.Close()
	d.toolURL = "http://" + ln.Addr().String()
	d.say("example tool server (create_ticket) listening on %s", d.toolURL)

	d.slack, err = startFakeSlack()
	if err != nil {
		return err
	}
	defer d.slack.close()

	cfg, err := config.Parse("demo.yaml", demoConfig, func(k string) (string, bool) {
		switch k {
		case "TOOL_URL":
			return d.toolURL, true
		case "SLACK_API_URL":
			return d.slack.url + "/api/", true
		}
		return os.LookupEnv(k)
	})
	if err == nil {
		err = daemon.Settle(cfg)
	}
	if err != nil {
		return fmt.Errorf("demo configuration: %w", err)
	}
	a.cfg = cfg

	if err := d.traffic(ctx, &crash); err != nil {
		return err
	}

	win := cfg.Policy(exampletool.Tool).ProcessingWindow + cfg.Reconcile.Grace
	d.say("\n-- waiting %s: the crashed calls' processing window + grace must pass before the reconciler may touch them --", win)
	select {
	case <-time.After(win + 200*time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}

	eng, closer, err := daemon.BuildEngine(ctx, cfg, pool, a.registry(), "demo-replica", a.logger, nil)
	if err != nil {
		return err
	}
	defer closer.Close()
	d.say("\n-- 3. one reconcile pass (ledgerkeeper reconcile) --")
	rep, err := eng.Run(ctx, reconcile.Options{})
	if err != nil {
		return err
	}
	printReconcile(d.out, rep, nil)
	// The pass vetted each probe before acting on it (by hand: ledgerkeeper probe check).
	if checks, err := reconcile.StoredChecks(ctx, pool); err == nil {
		for _, c := range checks {
			d.say("probe self-check of %s, before any of its keys changed (by hand: 'ledgerkeeper probe check'): %s", c.Tool, c.Summary)
		}
	}

	d.say("\n-- 4. the agent retries --")
	for _, key := range []string{"wf-2:step-1:create_ticket", "wf-3:step-1:create_ticket"} {
		code, body := d.call(ctx, key, `{"title":"Printer on fire","account_id":"A-7"}`)
		d.say("retry %s -> %d %s", key, code, body)
	}
	d.say("(the first retry replays the outcome the probe found: no second ticket; the second redoes the work the crash prevented)")
	// Counted at the sink, per key: what an agent's calls actually did.
	rows, err := pool.Query(ctx, `SELECT split_part(idempotency_key, ':', 1), count(*) FROM tickets GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return err
	}
	var counts []string
	total := 0
	for rows.Next() {
		var wf string
		var n int
		if err := rows.Scan(&wf, &n); err != nil {
			rows.Close()
			return err
		}
		counts = append(counts, fmt.Sprintf("%s %d", wf, n))
		total += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	d.say("tickets in the sink: %d (%s): one per call for wf-1, wf-2 and wf-3, however often they were retried; wf-5's two are the duplicate planted in step 2", total, strings.Join(counts, ", "))

	d.say("\n-- 5. alerts for what it could not resolve, posted to Slack --")
	delivery := a.deliverAlerts(ctx, pool)
	if delivery != nil {
		d.say("%d message(s) posted:", delivery.Messages)
	}
	for _, m := range d.slack.messages() {
		d.say("%s\n", indent(m))
	}

	d.say("-- 6. ledgerkeeper inspect wf-4:step-2:refund_payment --")
	in, err := operator.Inspect(ctx, pool, operator.InspectRequest{Key: "wf-4:step-2:refund_payment", HistoryLimit: 10, Windows: a.windows})
	if err != nil {
		return err
	}
	printInspection(a, in)
	if err := d.mcpStep(ctx); err != nil {
		return err
	}
	if err := d.slackStep(ctx, eng.Windows); err != nil {
		return err
	}
	d.say("\nDone. Next: 'ledgerkeeper demo --print-config' shows the configuration used; README.md explains each part.")
	d.say("Before deploying a probe of your own: 'ledgerkeeper probe check' runs its self-check and 'ledgerkeeper probe run KEY' probes one key by hand; neither writes anything.")
	return nil
}

// database returns the URL of a scratch database and how to drop it.
func (d *demo) database(ctx context.Context) (string, func(), error) {
	if raw := d.a.cfg.Database.URL.Reveal(); raw != "" {
		admin, err := pgx.Connect(ctx, raw)
		if err != nil {
			return "", nil, fmt.Errorf("cannot reach database at %s: %v", redactURL(raw), rootCause(err))
		}
		name := fmt.Sprintf("ledgerkeeper_demo_%d_%d", time.Now().Unix(), os.Getpid())
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			admin.Close(ctx)
			return "", nil, fmt.Errorf("create scratch database %s: %w", name, err)
		}
		cfg := admin.Config()
		d.say("using a scratch database %s on %s:%d (dropped at the end)", name, cfg.Host, cfg.Port)
		u, err := scratchURL(raw, name)
		if err != nil {
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
			admin.Close(ctx)
			return "", nil, err
		}
		return u, func() {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = admin.Exec(c, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			admin.Close(c)
		}, nil
	}
	d.say("no database URL given: starting a throwaway PostgreSQL from the local binaries...")
	srv, err := pgembed.Start(ctx, pgembed.Options{})
	if err != nil {
		return "", nil, fmt.Errorf("start an ephemeral PostgreSQL: %w (or give --database-url)", err)
	}
	d.say("PostgreSQL running on 127.0.0.1:%d (removed at the end)", srv.Port)
	return srv.URL, srv.Stop, nil
}

// scratchURL is raw pointed at database name instead: the path of a URL
// (never a text replacement: in postgres://postgres:pw@host/postgres the
// first "/postgres" is the user), or dbname= appended to a key=value DSN
// (the last setting wins). The result is checked by pgconn's own parser.
func scratchURL(raw, name string) (string, error) {
	u := ""
	if p, err := url.Parse(raw); err == nil && (p.Scheme == "postgres" || p.Scheme == "postgresql") {
		q := p.Query()
		if q.Has("dbname") {
			q.Set("dbname", name)
			p.RawQuery = q.Encode()
		}
		p.Path, p.RawPath = "/"+name, ""
		u = p.String()
	} else {
		u = strings.TrimSpace(raw) + " dbname=" + name
	}
	pc, err := pgconn.ParseConfig(u)
	if err != nil || pc.Database != name {
		return "", fmt.Errorf("the demo cannot point the database URL %s at its scratch database: give a URL of the form postgres://USER@HOST:PORT/DB (a password goes after USER and a colon)", redactURL(raw))
	}
	return u, nil
}

// traffic makes the tool calls whose outcomes the reconciler must settle.
func (d *demo) traffic(ctx context.Context, crash *sync.Map) error {
	d.say("\n-- 1. agents call create_ticket with Idempotency-Key {workflowRunId}:{stepId} --")
	body := `{"title":"Printer on fire","account_id":"A-7"}`
	code, resp := d.call(ctx, "wf-1:step-1:create_ticket", body)
	d.say("wf-1 first call   -> %d %s", code, resp)
	code, resp = d.call(ctx, "wf-1:step-1:create_ticket", body)
	d.say("wf-1 same key     -> %d %s", code, resp)
	code, resp = d.call(ctx, "wf-1:step-1:create_ticket", `{"title":"Other","account_id":"A-7"}`)
	d.say("wf-1 other body   -> %d %s", code, resp)
	// The connection drops; Go's HTTP client retries a request carrying
	// Idempotency-Key by itself, and that retry's 409 is what it returns:
	// the same answer as the agent's retry below, so it is not shown twice.
	_, _ = d.call(ctx, "wf-2:step-1:create_ticket", body)
	d.say("wf-2 crashes AFTER creating its ticket, before storing the response: the key stays processing")
	crash.Delete("wf-2:step-1:create_ticket")
	code, resp = d.call(ctx, "wf-2:step-1:create_ticket", body)
	d.say("wf-2 retry        -> %d %s (still processing: nothing runs twice)", code, resp)

	d.say("\n-- 2. what crashes and bugs leave behind --")
	hash, _ := ledger.Fingerprint([]byte(body))
	// Crashed before its effect: claimed, nothing downstream.
	if _, err := ledger.Claim(ctx, d.pool, ledger.ClaimParams{Key: "wf-3:step-1:create_ticket", Tool: exampletool.Tool, RequestHash: hash, RequestBody: json.RawMessage(body)}); err != nil {
		return err
	}
	d.say("wf-3 claimed its key, then crashed before creating the ticket")
	// A tool nobody configured a probe for.
	if _, err := ledger.Claim(ctx, d.pool, ledger.ClaimParams{Key: "wf-4:step-2:refund_payment", Tool: "refund_payment", RequestHash: hash}); err != nil {
		return err
	}
	d.say("wf-4 refund_payment crashed; refund_payment has no probe configured")
	// Two tickets downstream for one key: idempotency already broken there.
	if _, err := ledger.Claim(ctx, d.pool, ledger.ClaimParams{Key: "wf-5:step-1:create_ticket", Tool: exampletool.Tool, RequestHash: hash, RequestBody: json.RawMessage(body)}); err != nil {
		return err
	}
	if _, err := d.pool.Exec(ctx, `INSERT INTO tickets (idempotency_key, title, account_id) VALUES ($1, 'dup', 'A-7'), ($1, 'dup', 'A-7')`, "wf-5:step-1:create_ticket"); err != nil {
		return err
	}
	d.say("wf-5 crashed; the downstream holds TWO tickets for its key")
	return nil
}

func (d *demo) call(ctx context.Context, key, body string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.toolURL+"/tools/create_ticket", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "(no response: " + rootCause(err) + ")"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func indent(s string) string {
	return "  | " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n  | ")
}

// fakeSlack is a local stand-in for Slack: the Web API methods the alerts
// and the Slack actions call (chat.postMessage, chat.update,
// conversations.history, views.open, chat.postEphemeral) and response
// URLs, keeping the messages and what on-call was shown.
type fakeSlack struct {
	srv *http.Server
	url string
	mu  sync.Mutex
	got []string // the messages as posted, as on-call reads them
	// msgs are the messages as they stand (chat.update changes them).
	msgs    []*fakeMessage
	views   []json.RawMessage // views opened, newest last
	replies []string          // ephemeral answers, newest last
}

type fakeMessage struct {
	channel, ts, text string
	blocks            json.RawMessage
}

func startFakeSlack() (*fakeSlack, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &fakeSlack{url: "http://" + ln.Addr().String()}
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

// serve answers one call; every field is read from the form or the JSON
// body, as slack-go sends them.
func (f *fakeSlack) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var js map[string]json.RawMessage
	form := url.Values{}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(raw, &js)
	} else {
		form, _ = url.ParseQuery(string(raw))
	}
	field := func(name string) string {
		if v := form.Get(name); v != "" {
			return v
		}
		var str string
		if json.Unmarshal(js[name], &str) == nil {
			return str
		}
		return string(js[name])
	}
	answer := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/response/") {
		f.replies = append(f.replies, blocksOr([]byte(field("blocks")), field("text")))
		answer(map[string]any{"ok": true})
		return
	}
	switch strings.TrimPrefix(r.URL.Path, "/api/") {
	case "chat.postMessage":
		m := &fakeMessage{channel: field("channel"), ts: fmt.Sprintf("1700000000.%06d", len(f.msgs)+1), text: field("text"), blocks: json.RawMessage(field("blocks"))}
		f.msgs = append(f.msgs, m)
		f.got = append(f.got, blocksOr(m.blocks, m.text))
		answer(map[string]any{"ok": true, "channel": m.channel, "ts": m.ts})
	case "chat.update":
		if m := f.message(field("channel"), field("ts")); m != nil {
			m.text, m.blocks = field("text"), json.RawMessage(field("blocks"))
			answer(map[string]any{"ok": true, "channel": m.channel, "ts": m.ts})
			return
		}
		answer(map[string]any{"ok": false, "error": "message_not_found"})
	case "conversations.history":
		var found []any
		if m := f.message(field("channel"), field("latest")); m != nil {
			found = append(found, map[string]any{"type": "message", "ts": m.ts, "text": m.text, "blocks": m.blocks})
		}
		answer(map[string]any{"ok": true, "messages": found})
	case "views.open":
		var view map[string]any
		_ = json.Unmarshal(js["view"], &view)
		view["id"] = fmt.Sprintf("V0DEMO%d", len(f.views)+1)
		b, _ := json.Marshal(view)
		f.views = append(f.views, b)
		answer(map[string]any{"ok": true, "view": view})
	case "chat.postEphemeral":
		f.replies = append(f.replies, blocksOr([]byte(field("blocks")), field("text")))
		answer(map[string]any{"ok": true, "message_ts": "1700000001.000001"})
	default:
		answer(map[string]any{"ok": false, "error": "unknown_method"})
	}
}

// message is the message at channel and ts (nil: none); f.mu is held.
func (f *fakeSlack) message(channel, ts string) *fakeMessage {
	for _, m := range f.msgs {
		if m.channel == channel && m.ts == ts {
			return m
		}
	}
	return nil
}

func (f *fakeSlack) messages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

func (f *fakeSlack) close() { _ = f.srv.Close() }

// blocksOr shows what on-call sees (the message's blocks, as text), or the
// plain fallback when there are no blocks.
func blocksOr(blocks []byte, fallback string) string {
	if len(blocks) == 0 {
		return fallback
	}
	if t, err := alerts.BlocksText(blocks); err == nil && t != "" {
		return t
	}
	return fallback
}
