package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/reconcile"
)

// hostile is what a downstream can send back: 3,000 bytes of "é" (cut
// anywhere by bytes, it splits a character), NUL bytes and invalid UTF-8.
var hostile = strings.Repeat("é", 1500) + "\x00nul\x00" + "\xff\xfe bad utf-8 \xc3"

// No downstream answer can make a key undecidable: whatever the probe's
// error and evidence hold, the decision is written, the attempt counted,
// the alert raised, and the texts stored are valid, bounded UTF-8.
func TestHostileEvidenceNeverBlocksADecision(t *testing.T) {
	t.Parallel()
	// A downstream answering 500 with the hostile body, through the real
	// http probe.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(hostile))
	}))
	t.Cleanup(api.Close)
	httpProbe, err := probes.NewHTTP(probes.HTTPConfig{URL: api.URL + "/v1/tickets?idempotency_key={key}", Match: "data", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = httpProbe.Close() })

	cases := []struct {
		name  string
		probe probes.Probe
		// keep is a part of the error the stored text must still hold:
		// cleaning a text must not cost the evidence that fits.
		keep string
	}{
		{"http 500 with a hostile body", httpProbe, "500"},
		{"go probe: hostile error", probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
			return probes.Result{Verdict: probes.Unknown, Err: errors.New(hostile)}
		}), "ééé"},
		// Valid JSON that jsonb refuses (\u0000): only the retry without
		// the evidence can record this decision.
		{"go probe: evidence jsonb refuses", probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
			return probes.Result{Verdict: probes.Unknown, Err: errors.New("boom"), Evidence: json.RawMessage(`{"body":"a\u0000b"}`)}
		}), "dropped"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			stuck(t, db, "create_ticket", time.Minute, "k1")
			e := engine(t, db.Pool, reconcile.Config{AlertAfterAttempts: 1,
				Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: tc.probe}}})
			rep := run(t, e, reconcile.Options{})
			if len(rep.Keys) != 1 || rep.Keys[0].Action != reconcile.ActionBackoff {
				t.Fatalf("report %+v, want one backoff decision", rep.Keys)
			}
			if n := db.Count(t, `reconcile_state WHERE key = 'k1' AND attempts = 1`); n != 1 {
				t.Fatal("the attempt was not counted")
			}
			var errText string
			var evidence []byte
			if err := db.Pool.QueryRow(bg, `SELECT coalesce(error, ''), evidence FROM reconcile_audit WHERE key = 'k1'`).Scan(&errText, &evidence); err != nil {
				t.Fatalf("audit row: %v", err)
			}
			if !utf8.ValidString(errText) || strings.ContainsRune(errText, 0) || len(errText) > 2000 {
				t.Fatalf("stored error is not valid bounded UTF-8 (%d bytes)", len(errText))
			}
			if !strings.Contains(errText, tc.keep) {
				t.Fatalf("stored error %.80q lost %q", errText, tc.keep)
			}
			if len(evidence) > 0 && !json.Valid(evidence) {
				t.Fatalf("stored evidence is not JSON: %q", evidence)
			}
			if n := db.Count(t, `alert_outbox WHERE key = 'k1' AND reason = 'probe_failing'`); n != 1 {
				t.Fatalf("%d probe_failing alerts, want 1", n)
			}
		})
	}
}

// Secrets registered by the configuration never reach the audit trail,
// whether the probe put them in its error or its evidence.
func TestRegisteredSecretsAreRedactedFromTheAudit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	stuck(t, db, "create_ticket", time.Minute, "k1")
	const token = "tok-9f8e7d6c5b4a"
	red := secret.New()
	red.Register(token)
	probe := probes.ProbeFunc(func(context.Context, probes.Key) probes.Result {
		return probes.Result{Verdict: probes.Unknown, Err: errors.New("GET /v1/tickets?api_key=" + token + ": 401"),
			Evidence: json.RawMessage(`{"url":"/v1/tickets?api_key=` + token + `"}`)}
	})
	e := engine(t, db.Pool, reconcile.Config{AlertAfterAttempts: 1, Redactor: red,
		Tools: map[string]reconcile.Policy{"create_ticket": {ProcessingWindow: time.Second, Probe: probe}}})
	rep := run(t, e, reconcile.Options{})
	if b, _ := json.Marshal(rep); strings.Contains(string(b), token) {
		t.Fatal("the pass report carries the secret")
	}
	if n := db.Count(t, `reconcile_audit WHERE error LIKE '%'||$1||'%' OR evidence::text LIKE '%'||$1||'%'`, token); n != 0 {
		t.Fatal("the audit trail carries the secret")
	}
	if n := db.Count(t, `alert_outbox WHERE details::text LIKE '%'||$1||'%'`, token); n != 0 {
		t.Fatal("the alert carries the secret")
	}
	if n := db.Count(t, `reconcile_audit WHERE key = 'k1'`); n != 1 {
		t.Fatal("no decision recorded")
	}
}
