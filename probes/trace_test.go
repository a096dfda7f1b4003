package probes_test

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// A Trace shows an operator the request as sent and the start of the
// answer; header values are never recorded, and a probe without a Trace in
// its context records nothing anywhere.
func TestTraceRecordsRequestAndAnswer(t *testing.T) {
	t.Parallel()
	// The answer echoes the header's token (as a downstream refusing it
	// may), then runs past what a trace keeps.
	big := `{"data":[{"id":"T-1","echo":"header-secret-123","note":"` + strings.Repeat("é", probes.MaxTraceBodyBytes) + `"}]}`
	srv := newServer(t, reply(http.StatusOK, big))
	p, err := probes.NewHTTP(probes.HTTPConfig{URL: srv.URL + "/v1/tickets?idempotency_key={key}&api_key=k3y-in-url",
		Headers: map[string]string{"Authorization": "Bearer header-secret-123"}, Match: "data", ResponseBody: map[string]string{"ticket_id": "id"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	var tr probes.Trace
	res := p.Probe(probes.WithTrace(context.Background(), &tr), probes.Key{Key: "wf 1/a", Tool: "create_ticket"})
	if res.Verdict != probes.Found {
		t.Fatalf("verdict %s: %v", res.Verdict, res.Err)
	}
	xs := tr.Exchanges()
	if len(xs) != 1 {
		t.Fatalf("exchanges = %+v", xs)
	}
	x := xs[0]
	if x.Method != http.MethodGet || x.URL != srv.URL+"/v1/tickets?idempotency_key=wf+1%2Fa&api_key=k3y-in-url" {
		t.Errorf("request = %s %s", x.Method, x.URL)
	}
	if !slices.Equal(x.Headers, []string{"Accept", "Authorization"}) {
		t.Errorf("headers = %v, want the names only", x.Headers)
	}
	want := strings.Replace(big[:probes.MaxTraceBodyBytes], "header-secret-123", "[redacted]", 1)
	if !x.Answered || x.Status != http.StatusOK || x.BodyBytes != len(big) || string(x.Body) != want {
		t.Errorf("answer: answered %v status %d bytes %d kept %d, starting %.80s", x.Answered, x.Status, x.BodyBytes, len(x.Body), x.Body)
	}

	// The copy is the caller's: changing it does not change the trace.
	xs[0].Body[0] = 'X'
	if tr.Exchanges()[0].Body[0] != '{' {
		t.Error("Exchanges returned the trace's own buffer")
	}

	// No Trace attached (the engine's probes): nothing recorded.
	if res := p.Probe(context.Background(), probes.Key{Key: "k2", Tool: "create_ticket"}); res.Verdict != probes.Found {
		t.Fatalf("untraced probe: %s %v", res.Verdict, res.Err)
	}
	if n := len(tr.Exchanges()); n != 1 {
		t.Errorf("an untraced probe recorded into another probe's trace: %d exchanges", n)
	}
}

// A request that got no answer is recorded as sent, unanswered.
func TestTraceOfUnansweredRequest(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	p, err := probes.NewHTTP(probes.HTTPConfig{URL: "http://" + addr + "/v1/tickets?k={key}"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var tr probes.Trace
	res := probes.Guard(p, 0).Probe(probes.WithTrace(context.Background(), &tr), probes.Key{Key: "k", Tool: "t"})
	if res.Verdict != probes.Unknown || !probes.Unreachable(res) {
		t.Fatalf("verdict %s unreachable %v: %v", res.Verdict, probes.Unreachable(res), res.Err)
	}
	xs := tr.Exchanges()
	if len(xs) != 1 || xs[0].Answered || xs[0].URL != "http://"+addr+"/v1/tickets?k=k" {
		t.Fatalf("exchanges = %+v", xs)
	}
}
