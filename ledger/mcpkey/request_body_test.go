package mcpkey_test

import (
	"encoding/json"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
)

// RequestBody is the request_body Wrap stores (conformance gives it to the
// probe): canonical JSON, absent and null arguments as {}.
func TestRequestBodyIsWhatWrapStores(t *testing.T) {
	for _, tc := range []struct {
		args json.RawMessage
		want string
	}{
		{nil, `{"arguments":{},"tool":"create_ticket"}`},
		{json.RawMessage(`null`), `{"arguments":{},"tool":"create_ticket"}`},
		{json.RawMessage(`{}`), `{"arguments":{},"tool":"create_ticket"}`},
		{json.RawMessage(`{"title": "x", "account_id": 7}`), `{"arguments":{"account_id":7,"title":"x"},"tool":"create_ticket"}`},
	} {
		got, err := mcpkey.RequestBody("create_ticket", tc.args)
		if err != nil || string(got) != tc.want {
			t.Errorf("RequestBody(%s) = %s, %v; want %s", tc.args, got, err, tc.want)
		}
	}
}
