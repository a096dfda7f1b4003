package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

const httpProbeHead = "tools:\n  t:\n    probe:\n      type: http\n      url: \"http://x/v1/tickets/{key}\"\n"

// TestSettleRefusesBadAbsenceSettings: the probe package's refusals of
// not_found_on_404 and not_found_body come back as file:line: key, and
// the two keys belong to http probes only.
func TestSettleRefusesBadAbsenceSettings(t *testing.T) {
	const sqlHead = "tools:\n  t:\n    probe:\n      type: sql\n      database_url: postgres://x/y\n      query: select 1\n"
	tests := []struct{ name, yaml, want string }{
		{"unknown mode", httpProbeHead + "      not_found_on_404: always\n", `lk.yaml:6: tools.t.probe.not_found_on_404: must be json or any, got "always"`},
		{"body without equals", httpProbeHead + "      not_found_body:\n        path: error.code\n", `lk.yaml:6: tools.t.probe.not_found_body.equals: required`},
		{"body without path", httpProbeHead + "      not_found_body:\n        equals: ticket_not_found\n", `lk.yaml:6: tools.t.probe.not_found_body.path: required`},
		{"body path as JSONPath", httpProbeHead + "      not_found_body:\n        path: $.error.code\n        equals: x\n", `lk.yaml:7: tools.t.probe.not_found_body.path: "$.error.code" looks like JSONPath`},
		{"body with any", httpProbeHead + "      not_found_on_404: any\n      not_found_body: {path: error.code, equals: x}\n", `lk.yaml:7: tools.t.probe.not_found_body: contradicts not_found_on_404: any`},
		{"body with HEAD", httpProbeHead + "      method: HEAD\n      not_found_body: {path: error.code, equals: x}\n", `lk.yaml:7: tools.t.probe.not_found_body: a HEAD response has no body`},
		{"body on an sql probe", sqlHead + "      not_found_body: {path: error.code, equals: x}\n", `lk.yaml:7: tools.t.probe.not_found_body: belongs to http probes`},
		{"mode on an sql probe", sqlHead + "      not_found_on_404: any\n", `lk.yaml:7: tools.t.probe.not_found_on_404: belongs to http probes`},
		{"mode on a go probe", "tools:\n  t:\n    probe:\n      type: go\n      not_found_on_404: json\n", `lk.yaml:5: tools.t.probe.not_found_on_404: belongs to http probes`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := settle(t, tt.yaml, envOf(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestEngineConfigCarriesTheWitnessSettings: canaries and require_witness
// reach the engine's policy; by default a witness is required.
func TestEngineConfigCarriesTheWitnessSettings(t *testing.T) {
	y := httpProbeHead + `      self_check:
        require_witness: false
        canaries:
          - key: canary-1
            request: {ref: T-1, n: 2}
          - key: canary-2
  u:
    probe:
      type: http
      url: "http://x/{key}"
      self_check: {require_witness: true}
  v:
    probe:
      type: go
`
	c, err := settle(t, y, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	pols := EngineConfig(c, nil, "test").Tools
	got := pols["t"]
	if !got.WitnessNotRequired || len(got.Canaries) != 2 || got.Canaries[0].Key != "canary-1" || got.Canaries[1].Key != "canary-2" ||
		got.Canaries[1].Request != nil {
		t.Fatalf("policy t: %+v", got)
	}
	var req map[string]any
	if err := json.Unmarshal(got.Canaries[0].Request, &req); err != nil || req["ref"] != "T-1" || req["n"] != float64(2) {
		t.Fatalf("canary request %s: %v", got.Canaries[0].Request, err)
	}
	for _, tool := range []string{"u", "v"} {
		if p := pols[tool]; p.WitnessNotRequired || p.Canaries != nil {
			t.Fatalf("policy %s: %+v, want a witness required and no canaries", tool, p)
		}
	}
	if err := EngineConfig(c, nil, "test").Validate(); err != nil {
		t.Fatalf("engine refuses the wired config: %v", err)
	}
}

// TestProbeFingerprintCoversTheAbsenceSettings: changing any of the four
// settings changes the fingerprint, so the next pass checks the probe
// again; writing the defaults out does not.
func TestProbeFingerprintCoversTheAbsenceSettings(t *testing.T) {
	fp := func(extra string) string {
		t.Helper()
		c, err := settle(t, httpProbeHead+extra, envOf(nil))
		if err != nil {
			t.Fatalf("%q: %v", extra, err)
		}
		return EngineConfig(c, nil, "test").Tools["t"].ProbeFingerprint
	}
	base := fp("")
	if same := fp("      not_found_on_404: json\n"); same != base {
		t.Errorf("writing the default not_found_on_404 changed the fingerprint")
	}
	seen := map[string]string{"": base}
	for _, extra := range []string{
		"      not_found_on_404: any\n",
		"      not_found_body: {path: error.code, equals: ticket_not_found}\n",
		"      not_found_body: {path: error.code, equals: not_found}\n",
		"      self_check: {require_witness: false}\n",
		"      self_check:\n        canaries: [{key: c-1}]\n",
		"      self_check:\n        canaries: [{key: c-2}]\n",
		"      self_check:\n        canaries: [{key: c-1, request: {ref: r}}]\n",
	} {
		got := fp(extra)
		for prev, f := range seen {
			if f == got {
				t.Errorf("%q has the fingerprint of %q", extra, prev)
			}
		}
		seen[extra] = got
	}
}

// TestWarningsNameTheDangerousSettings: config check's warnings, with the
// key's file and line; a configuration without them has none.
func TestWarningsNameTheDangerousSettings(t *testing.T) {
	c, err := settle(t, httpProbeHead+"      not_found_on_404: any\n      self_check:\n        enabled: false\n        require_witness: false\n", envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"lk.yaml:8: tools.t.probe.self_check.enabled: false: verdicts are acted on unchecked; a probe broken on day one would mark keys retryable whose effect happened (dangerous)",
		"lk.yaml:6: tools.t.probe.not_found_on_404: any: every 404 counts as absence, even a router's or ingress's error page; only for an API whose 404s have no body",
		"lk.yaml:9: tools.t.probe.self_check.require_witness: false: not_found verdicts are applied with no witness that the probe can find anything; a typo'd path answering 404 would mark keys retryable whose effect happened (dangerous)",
	}
	if got := Warnings(c); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("warnings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	c, err = settle(t, full, fullEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := Warnings(c); len(got) != 0 {
		t.Fatalf("warnings for a safe configuration: %q", got)
	}
}

// TestBuildProbesPassesThe404Settings: the http probe BuildProbes builds
// judges a 404 as configured: a router's HTML 404 is unknown by default
// and absence with not_found_on_404: any; a JSON 404 is absence only when
// it matches not_found_body.
func TestBuildProbesPassesThe404Settings(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"ticket_not_found"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, "<html><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>")
	}))
	t.Cleanup(srv.Close)
	tool := func(name, path, extra string) string {
		return "  " + name + ":\n    probe:\n      type: http\n      url: \"" + srv.URL + path + "\"\n" + extra
	}
	y := "tools:\n" +
		tool("html_default", "/v1/tickets/{key}", "") +
		tool("html_any", "/v1/tickets/{key}", "      not_found_on_404: any\n") +
		tool("json_match", "/api/tickets/{key}", "      not_found_body: {path: error.code, equals: ticket_not_found}\n") +
		tool("json_mismatch", "/api/tickets/{key}", "      not_found_body: {path: error.code, equals: gone}\n")
	c, err := settle(t, y, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	built, closer, err := BuildProbes(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	for name, want := range map[string]probes.Verdict{
		"html_default": probes.Unknown, "html_any": probes.NotFound, "json_match": probes.NotFound, "json_mismatch": probes.Unknown,
	} {
		res := built[name].Probe(context.Background(), probes.Key{Key: "k-1", Tool: name})
		if res.Verdict != want {
			t.Errorf("%s: %s (%v), want %s", name, res.Verdict, res.Err, want)
		}
	}
}
