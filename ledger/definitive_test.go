package ledger_test

import (
	"fmt"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// The stored-outcome rule over its edges: success and business refusals are
// stored and replayed; "try again later", server errors and tool errors
// never are, whatever their code.
func TestDefinitiveStoresSuccessAndRefusalsNeverRetryLaterOrFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		resp ledger.Response
		want bool
	}{
		{ledger.Response{Code: 200}, true},
		{ledger.Response{Code: 201}, true},
		{ledger.Response{Code: 204}, true},
		{ledger.Response{Code: 299}, true},
		{ledger.Response{Code: 301}, true}, // below 500: stored, as it always was
		{ledger.Response{Code: 400}, true},
		{ledger.Response{Code: 404}, true},
		{ledger.Response{Code: 407}, true},
		{ledger.Response{Code: 408}, false}, // Request Timeout
		{ledger.Response{Code: 409}, true},
		{ledger.Response{Code: 422}, true},
		{ledger.Response{Code: 424}, true},
		{ledger.Response{Code: 425}, false}, // Too Early
		{ledger.Response{Code: 426}, true},
		{ledger.Response{Code: 428}, true},
		{ledger.Response{Code: 429}, false}, // Too Many Requests
		{ledger.Response{Code: 430}, true},
		{ledger.Response{Code: 499}, true},
		{ledger.Response{Code: 500}, false},
		{ledger.Response{Code: 503}, false},
		{ledger.Response{Code: 599}, false},
		{ledger.Response{Code: 600}, false},
		// An MCP result: 200 unless it is a tool error.
		{ledger.Response{Code: 200, Body: []byte(`{"content":[]}`)}, true},
		{ledger.Response{Code: 200, IsError: true}, false},
		{ledger.Response{IsError: true}, false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d/error=%v", c.resp.Code, c.resp.IsError), func(t *testing.T) {
			if got := ledger.Definitive(c.resp); got != c.want {
				t.Fatalf("Definitive(%+v) = %v, want %v", c.resp, got, c.want)
			}
		})
	}
}
