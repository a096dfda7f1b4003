package ledger_test

import (
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Golden fingerprints: request_hash is stored with every key, and a retry
// compares the fingerprint of its body with it. Were an upgrade (of Go's
// encoding/json, or of Canonical) to change one byte of the canonical form,
// every stored key would stop matching its own retries
// (fingerprint_mismatch). These values are fixed forever: never regenerate
// them to make this test pass.
func TestFingerprintGolden(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, canonical, hash string
	}{
		{"empty body is null", ``, `null`,
			"74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b"},
		{"keys sorted, whitespace gone", "{\"title\" : \"SSO broken\",\n \"account_id\":\"A-1029\",\"n\":[1, 2,{\"b\":1,\"a\":2}]}",
			`{"account_id":"A-1029","n":[1,2,{"a":2,"b":1}],"title":"SSO broken"}`,
			"7d72375c710d74cd1f7f740e7fd0c48cce9783c08b34ab6ba5e51d77cc1a84b8"},
		// Beyond float64's 53 bits: without json.Number both would be
		// 1.2345678901234567e+19, one fingerprint for two requests.
		{"big integer", `{"n":12345678901234567890}`, `{"n":12345678901234567890}`,
			"8716eed5e3ea73042324b69568de421fc67f1547923dcb85ab0d1e156d6e0588"},
		{"big integer + 1", `{"n":12345678901234567891}`, `{"n":12345678901234567891}`,
			"92efd89d8e49c16de7a63f34b28670296949e3418bbc985581a967cecfda1e9c"},
		{"numbers keep their literal text", `[1, 1.0, 1e3, 1E3, -0, 0.1, 123456789012345678901234567890]`,
			`[1,1.0,1e3,1E3,-0,0.1,123456789012345678901234567890]`,
			"d742e003f0c53a319013095d7d5f8fe832af51c16c2057f744cf7af6f960bff2"},
		// Not HTML-escaped (\u003c...): the body's own text.
		{"HTML characters", `{"html":"<a href=\"x\">&</a>"}`, `{"html":"<a href=\"x\">&</a>"}`,
			"f530516c01fa099b3647540b6a9d7b411cf7476a3278d86e463c9dc046de0707"},
		{"string escapes", `{"s":"caf\u00e9 é 😀 \u2028\u2029 \t\n \"q\" \\ \u0000 \u001f"}`,
			`{"s":"café é 😀 \u2028\u2029 \t\n \"q\" \\ \u0000 \u001f"}`,
			"ee96dee2b9621830be91167c617689cb12d312f233bce0ae2ca7cd4918d34164"},
		{"literals and empty containers", `{"z":null,"y":true,"x":false,"w":{},"v":[]}`, `{"v":[],"w":{},"x":false,"y":true,"z":null}`,
			"accecafb2e6e12972bc1df2663a21dd3da2136bb4cd43a8ef2c9329d9124652d"},
	} {
		canon, err := ledger.Canonical([]byte(tc.body))
		if err != nil {
			t.Errorf("%s: Canonical: %v", tc.name, err)
			continue
		}
		if string(canon) != tc.canonical {
			t.Errorf("%s: canonical form changed:\n got %s\nwant %s", tc.name, canon, tc.canonical)
		}
		hash, err := ledger.Fingerprint([]byte(tc.body))
		if err != nil || hash != tc.hash {
			t.Errorf("%s: fingerprint %s (%v), want %s: stored keys would no longer match their retries", tc.name, hash, err, tc.hash)
		}
	}
	a, _ := ledger.Fingerprint([]byte(`{"n":12345678901234567890}`))
	b, _ := ledger.Fingerprint([]byte(`{"n":12345678901234567891}`))
	if a == b {
		t.Errorf("two requests differing in a big integer share fingerprint %s", a)
	}
}
