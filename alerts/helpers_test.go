package alerts

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	testToken   = "xoxb-1111-2222-SECRETTOKEN"
	webhookPath = "/services/T000/B000/SECRETWEBHOOKPART"
	testRunbook = "https://runbook.example/ledgerkeeper/runbook.md"
)

// received is one request the fake Slack got, decoded.
type received struct {
	Path     string
	Raw      []byte
	Text     string
	Blocks   string // JSON
	Token    string
	Channel  string
	Accepted bool
}

// texts returns every text the message would show: the fallback and every
// "text" string inside the blocks.
func (r received) texts(t testing.TB) []string {
	t.Helper()
	out := []string{r.Text}
	var v any
	if err := json.Unmarshal([]byte(r.Blocks), &v); err != nil {
		t.Fatalf("blocks are not JSON: %v: %s", err, r.Blocks)
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if s, ok := e.(string); ok && k == "text" {
					out = append(out, s)
				} else {
					walk(e)
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

var keyRE = regexp.MustCompile("\\*Key\\* `([^`]+)`")

// keys lists the keys a message names, in order.
func (r received) keys(t testing.TB) []string {
	var keys []string
	for _, s := range r.texts(t) {
		for _, m := range keyRE.FindAllStringSubmatch(s, -1) {
			keys = append(keys, m[1])
		}
	}
	return keys
}

type reply struct {
	status int
	header map[string]string
	body   string
}

// fakeSlack speaks chat.postMessage (form or JSON) at /api/ and incoming
// webhooks at webhookPath. respond picks the answer to the n-th request
// (from 0); nil answers success.
type fakeSlack struct {
	*httptest.Server
	mu      sync.Mutex
	reqs    []received
	respond func(n int, path string) reply
}

func newFakeSlack(t testing.TB, respond func(n int, path string) reply) *fakeSlack {
	f := &fakeSlack{respond: respond}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeSlack) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	rec := received{Path: r.URL.Path, Raw: raw}
	isAPI := r.URL.Path == "/api/chat.postMessage"
	switch {
	case isAPI:
		ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if ct == "application/json" {
			var body map[string]any
			_ = json.Unmarshal(raw, &body)
			rec.Text, _ = body["text"].(string)
			rec.Channel, _ = body["channel"].(string)
			b, _ := json.Marshal(body["blocks"])
			rec.Blocks = string(b)
			rec.Token = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		} else {
			r.Body = io.NopCloser(bytes.NewReader(raw))
			_ = r.ParseForm()
			rec.Text, rec.Blocks = r.PostForm.Get("text"), r.PostForm.Get("blocks")
			rec.Token, rec.Channel = r.PostForm.Get("token"), r.PostForm.Get("channel")
		}
	case r.URL.Path == webhookPath:
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		rec.Text, _ = body["text"].(string)
		b, _ := json.Marshal(body["blocks"])
		rec.Blocks = string(b)
	default:
		http.NotFound(w, r)
		return
	}
	f.mu.Lock()
	n := len(f.reqs)
	f.reqs = append(f.reqs, rec)
	f.mu.Unlock()

	rp := reply{status: 200}
	if f.respond != nil {
		rp = f.respond(n, r.URL.Path)
	}
	if rp.body == "" && rp.status == 200 {
		rp.body = "ok"
		if isAPI {
			rp.body = `{"ok":true,"channel":"C0ONCALL","ts":"1700000000.000100"}`
		}
	}
	accepted := rp.status == 200 && (!isAPI || strings.Contains(rp.body, `"ok":true`))
	f.mu.Lock()
	f.reqs[n].Accepted = accepted
	f.mu.Unlock()
	for k, v := range rp.header {
		w.Header().Set(k, v)
	}
	if isAPI {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "text/html")
	}
	w.WriteHeader(rp.status)
	_, _ = io.WriteString(w, rp.body)
}

// requests returns every request so far.
func (f *fakeSlack) requests() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.reqs...)
}

// accepted returns the messages Slack took.
func (f *fakeSlack) accepted() []received {
	var out []received
	for _, r := range f.requests() {
		if r.Accepted {
			out = append(out, r)
		}
	}
	return out
}

func (f *fakeSlack) botNotifier(t testing.TB) Notifier {
	t.Helper()
	n, err := NewSlack(SlackConfig{Token: testToken, Channel: "#oncall", APIURL: f.URL + "/api/", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fakeSlack) webhookNotifier(t testing.TB) Notifier {
	t.Helper()
	n, err := NewSlack(SlackConfig{WebhookURL: f.URL + webhookPath, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// clock is a pinned clock the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock starts a little ahead of the database's clock, so rows raised
// with now() during the test are due.
func newClock() *clock { return &clock{t: time.Now().Add(time.Minute).Truncate(time.Microsecond)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// kinds records each attribute's slog kind by key: a duration must be
	// logged as one (the daemon's JSON handler writes it in seconds), not
	// as a string.
	kinds map[string]slog.Kind
}

func (l *logBuffer) replaceAttr(_ []string, a slog.Attr) slog.Attr {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kinds == nil {
		l.kinds = map[string]slog.Kind{}
	}
	l.kinds[a.Key] = a.Value.Kind()
	return a
}

func (l *logBuffer) kind(key string) slog.Kind {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.kinds[key]
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// bundle is what most tests need.
type bundle struct {
	db    *pgtest.DB
	clock *clock
	logs  *logBuffer
	ctx   context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{db: pgtest.New(t), clock: newClock(), logs: &logBuffer{}, ctx: context.Background()}
}

// dispatcher builds a Dispatcher on the bundle's database and clock with
// short back-offs; mod adjusts the Config.
func (b *bundle) dispatcher(n Notifier, m *Metrics, mod ...func(*Config)) *Dispatcher {
	cfg := Config{
		BackoffBase:      10 * time.Second,
		BackoffMax:       time.Minute,
		PermanentBackoff: 15 * time.Minute,
		RunbookURL:       testRunbook,
		NotifyTimeout:    10 * time.Second,
		Now:              b.clock.Now,
	}
	for _, f := range mod {
		f(&cfg)
	}
	logger := slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: b.logs.replaceAttr}))
	return New(b.db.Pool, cfg, n, logger, m)
}

func (b *bundle) raise(t *testing.T, a Alert) {
	t.Helper()
	if _, err := Raise(b.ctx, b.db.Pool, a, time.Hour); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) run(t *testing.T, d *Dispatcher) Report {
	t.Helper()
	rep, err := d.RunOnce(b.ctx)
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	return rep
}

func keyAlert(reason Reason, tool, key string) Alert {
	created := time.Now().Add(-2*time.Hour - 13*time.Minute)
	return Alert{Reason: reason, Tool: tool, Key: key, Details: Details{
		Attempts: 4, CreatedAt: &created, ClaimedAt: &created, Verdict: "unknown",
		LastError: "GET http://tickets.internal/v1/tickets?idempotency_key=" + key + ": 503 Service Unavailable",
	}}
}
