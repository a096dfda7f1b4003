package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

const interactiveBase = `alerts:
  slack:
    token: xoxb-bot-token-1
    channel: "#oncall"
`

// interactive: true needs a bot token, operators and a transport; the
// operators must look like Slack users with known actions. Every problem
// names the file, line and key.
func TestSettleInteractive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		want       []string // substrings of the error; none: valid
	}{
		{name: "socket mode", yaml: interactiveBase + `    interactive: true
    app_token: xapp-1-A0-123-abc
    operators: {U012ABC: alice}
`},
		{name: "http endpoint and long form", yaml: interactiveBase + `    interactive: true
    signing_secret: 8f742231b10e8888abcd99yyyzzz85a5
    operators:
      U012ABC: {name: alice, actions: [inspect, hold, release, mark_retryable, store_outcome]}
      W0GRID99: bob
`},
		{name: "off: keys may stay, nothing is needed", yaml: interactiveBase + `    operators: {U012ABC: alice}
`},
		{name: "needs everything", yaml: `alerts:
  slack:
    interactive: true
`, want: []string{
			"lk.yaml:3: alerts.slack.interactive: needs alerts.slack.token (a bot token)",
			"lk.yaml:3: alerts.slack.interactive: needs alerts.slack.operators",
			"lk.yaml:3: alerts.slack.interactive: needs a transport: alerts.slack.app_token (Socket Mode, no public ingress) or alerts.slack.signing_secret (serve's /slack/interactions)",
		}},
		{name: "webhook cannot be updated", yaml: interactiveBase + `    webhook_url: https://hooks.slack.com/services/T0/B0/XYZXYZXYZXYZ
    interactive: true
    app_token: xapp-1
    operators: {U012ABC: alice}
`, want: []string{"lk.yaml:5: alerts.slack.webhook_url: interactive alerts are posted with alerts.slack.token: remove webhook_url"}},
		{name: "bad operators", yaml: interactiveBase + `    interactive: true
    app_token: xoxb-not-an-app-token
    operators:
      alice: alice
      U012ABC: ""
      U0NAMELESS: {actions: [inspect]}
      U0ACTIONS: {name: carol, actions: [inspect, resolve, inspect]}
`, want: []string{
			"lk.yaml:6: alerts.slack.app_token: not an app-level token (xapp-…)",
			`lk.yaml:8: alerts.slack.operators.alice: "alice" is not a Slack user ID`,
			"lk.yaml:9: alerts.slack.operators.U012ABC.name: required",
			"lk.yaml:10: alerts.slack.operators.U0NAMELESS.name: required",
			`lk.yaml:11: alerts.slack.operators.U0ACTIONS.actions[1]: unknown action "resolve" (want inspect, hold, release, mark_retryable, store_outcome)`,
			`lk.yaml:11: alerts.slack.operators.U0ACTIONS.actions[2]: action "inspect" listed twice`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := settle(t, tc.yaml, envOf(nil))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%v", w, err)
				}
			}
			if n := strings.Count(err.Error(), "\n") + 1; n != len(tc.want) {
				t.Errorf("%d errors, want %d:\n%v", n, len(tc.want), err)
			}
		})
	}
}

// The summary `config check` prints and serve logs names the transports,
// never a secret.
func TestInteractiveSummary(t *testing.T) {
	t.Parallel()
	c, err := settle(t, interactiveBase+`    interactive: true
    app_token: xapp-1-A0-secret-777
    signing_secret: signing-secret-888
    operators: {U012ABC: alice, U0BOB: bob}
`, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	got := InteractiveSummary(c)
	want := "Slack actions: on, Socket Mode (alerts.slack.app_token) and POST /slack/interactions on :9464 (alerts.slack.signing_secret); 2 operator(s) may act"
	if got != want {
		t.Errorf("summary:\n got %q\nwant %q", got, want)
	}
	c.Alerts.Slack.Interactive = false
	if got := InteractiveSummary(c); got != "Slack actions: off (alerts.slack.interactive: false)" {
		t.Errorf("off: %q", got)
	}
}

// recordingService notes its Start and Stop in the shared order.
type recordingService struct {
	name  string
	mu    *sync.Mutex
	order *[]string
	fail  error
}

func (s recordingService) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.order = append(*s.order, "start "+s.name)
	return s.fail
}

func (s recordingService) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.order = append(*s.order, "stop "+s.name)
}

// Routes are served beside the daemon's own endpoints; services start
// with the daemon and stop with it, and a service that cannot start stops
// the ones started before it.
func TestDaemonRoutesAndServices(t *testing.T) {
	var mu sync.Mutex
	var order []string
	svc := func(name string, fail error) Service {
		return recordingService{name: name, mu: &mu, order: &order, fail: fail}
	}
	d, err := New(Config{
		Listen:   "127.0.0.1:0",
		Routes:   map[string]http.Handler{"POST " + InteractionsPath: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })},
		Services: []Service{svc("a", nil), svc("b", nil)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+d.Addr()+InteractionsPath, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("POST %s: %d", InteractionsPath, resp.StatusCode)
	}
	if code, _ := get(t, "http://"+d.Addr()+InteractionsPath); code != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d, want 405", InteractionsPath, code)
	}
	if code, _ := get(t, "http://"+d.Addr()+"/healthz"); code != http.StatusOK {
		t.Errorf("healthz beside the routes: %d", code)
	}
	stop(t, d)
	mu.Lock()
	if got := strings.Join(order, ", "); got != "start a, start b, stop a, stop b" {
		t.Errorf("order: %s", got)
	}
	order = nil
	mu.Unlock()

	d, err = New(Config{Listen: "127.0.0.1:0", Services: []Service{svc("a", nil), svc("b", errors.New("no"))}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "start service: no") {
		t.Errorf("start with a failing service: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ", "); got != "start a, start b, stop a" {
		t.Errorf("order: %s", got)
	}
}

// Slack actions' services stop in this order: Socket Mode first (it
// finishes the interactions in hand), then the Handler (it sends their
// answers and updates); with the request URL alone, the Handler still is
// a service, so its follow-ups are waited for at shutdown.
func TestInteractivityServicesStopSocketModeFirst(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		transports string
		want       []string
	}{
		{"    app_token: xapp-1-A0-secret-777\n    signing_secret: signing-secret-888\n", []string{"*interact.SocketMode", "*interact.Handler"}},
		{"    signing_secret: signing-secret-888\n", []string{"*interact.Handler"}},
	} {
		c, err := settle(t, interactiveBase+"    interactive: true\n"+tc.transports+"    operators: {U012ABC: alice}\n", envOf(nil))
		if err != nil {
			t.Fatal(err)
		}
		in, err := BuildInteractivity(c, new(pgxpool.Pool), nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range in.Services() {
			got = append(got, fmt.Sprintf("%T", s))
		}
		if strings.Join(got, ", ") != strings.Join(tc.want, ", ") {
			t.Errorf("services %v, want %v", got, tc.want)
		}
		in.Handler.Stop()
	}
	if (*Interactivity)(nil).Services() != nil {
		t.Error("services without Slack actions")
	}
}
