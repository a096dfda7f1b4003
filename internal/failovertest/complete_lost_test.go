package failovertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// The effect happened and the Complete recording it was lost with its
// connection (cut before it reached the server, as a failover cuts it):
// the caller still gets the tool's answer, the key stays processing, a
// retry gets 409; serve's reconciler then finds the ticket at the sink and
// stores it, and the retry after that replays it. One effect throughout.
func TestCompleteLostAcrossAFailoverIsReconciledThenReplayed(t *testing.T) {
	t.Parallel()
	srv, err := pgembed.Start(context.Background(), pgembed.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL (apt-get install postgresql): %v", err)
	}
	t.Cleanup(srv.Stop)
	url := srv.URL
	migrate(t, url)
	s := newSink(t)
	startServe(t, url, s)

	proxy := ledgertest.StartCutProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(srv.Port)))
	pc, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&pool_max_conns=1", proxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	ledger.FollowPrimary(pc, ledger.FollowOptions{})
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
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
	ts := httptest.NewServer(ledger.Middleware(ledger.MiddlewareConfig{DB: pool, Tool: "create_ticket"}, tool))
	t.Cleanup(ts.Close)
	call := func() (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader(`{"title":"lost complete"}`)) //nolint:noctx // a test's call
		req.Header.Set(ledger.HeaderIdempotencyKey, "lost-complete")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(ledger.HeaderReplayed), string(b)
	}
	status := func() (string, string) {
		var st, body string
		db := admin{url: url}
		db.must(t, `SELECT status, coalesce(response_body::text, '') FROM idempotency_keys WHERE key = 'lost-complete'`, nil, &st, &body)
		return st, body
	}

	proxy.Arm("SET status = 'completed'", false)
	if code, _, body := call(); code != http.StatusCreated {
		t.Fatalf("first call: %d %s, want the tool's 201", code, body)
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts())
	}
	if st, _ := status(); st != ledger.StatusProcessing {
		t.Fatalf("after the lost Complete the key is %s, want processing", st)
	}
	if code, _, body := call(); code != http.StatusConflict {
		t.Fatalf("retry before the reconciler: %d %s, want 409", code, body)
	}
	testwait.Eventually(t, func() bool { st, _ := status(); return st == ledger.StatusCompleted }, 60*time.Second,
		"serve's reconciler to complete the key from the sink")
	if _, body := status(); !strings.Contains(body, "T-lost-complete-0") {
		t.Errorf("stored outcome %s, want the ticket the sink holds", body)
	}
	code, replayed, body := call()
	if code != http.StatusCreated || replayed != "true" || !strings.Contains(body, "T-lost-complete-0") {
		t.Errorf("retry after the reconciler: %d replayed=%q %s, want the stored 201 replayed", code, replayed, body)
	}
	if n := s.all()["lost-complete"]; n != 1 {
		t.Errorf("%d effects at the sink, want 1", n)
	}
}
