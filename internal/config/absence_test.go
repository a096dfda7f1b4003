package config

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestProbeAbsenceSettingsDecode: not_found_body, not_found_on_404 and the
// self-check's canaries and require_witness decode as written; a canary's
// request is the JSON object its YAML mapping denotes (types kept, ${VAR}
// expanded into strings).
func TestProbeAbsenceSettingsDecode(t *testing.T) {
	const y = `tools:
  tickets:
    probe:
      type: http
      url: "http://x/v1/tickets/{request.ref}"
      not_found_on_404: json
      not_found_body: {path: error.code, equals: ticket_not_found}
      self_check:
        require_witness: false
        canaries:
          - key: canary-ticket-1
            request:
              ref: T-1
              account: ${ACCOUNT}
              amount: 1200
              ratio: 0.5
              zip: "01234"
              urgent: true
              note: null
              tags: [a, 2]
              nested: {id: 7}
          - key: canary-ticket-2
`
	c, err := Parse("lk.yaml", []byte(y), env(map[string]string{"ACCOUNT": "acc-42"}))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Tools["tickets"].Probe
	if p.NotFoundOn404 != "json" || p.NotFoundBody == nil || *p.NotFoundBody != (NotFoundBody{Path: "error.code", Equals: "ticket_not_found"}) {
		t.Fatalf("404 settings = %q %+v", p.NotFoundOn404, p.NotFoundBody)
	}
	if p.WitnessRequired() {
		t.Fatal("require_witness: false read as true")
	}
	cs := p.SelfCheck.Canaries
	if len(cs) != 2 || cs[0].Key != "canary-ticket-1" || cs[1].Key != "canary-ticket-2" || cs[1].Request != nil {
		t.Fatalf("canaries = %+v", cs)
	}
	var got, want any
	if err := json.Unmarshal(cs[0].Request, &got); err != nil {
		t.Fatalf("request %s: %v", cs[0].Request, err)
	}
	_ = json.Unmarshal([]byte(`{"ref":"T-1","account":"acc-42","amount":1200,"ratio":0.5,"zip":"01234","urgent":true,"note":null,"tags":["a",2],"nested":{"id":7}}`), &want)
	if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
		t.Fatalf("request = %s, want %s", g, w)
	}

	// Absent: the defaults (json, a witness required, no canaries).
	c, err = Parse("lk.yaml", []byte("tools:\n  tickets:\n    probe:\n      type: http\n      url: \"http://x/{key}\"\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Tools["tickets"].Probe; !p.WitnessRequired() || p.NotFoundBody != nil || p.NotFoundOn404 != "" || p.SelfCheck.Canaries != nil {
		t.Fatalf("defaults: %+v", p)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestProbeAbsenceSettingsRefused: what the decoder and the canary check
// refuse, each with file:line: key. The probe's own judgement of
// not_found_body and not_found_on_404 is internal/daemon's.
func TestProbeAbsenceSettingsRefused(t *testing.T) {
	const head = "tools:\n  tickets:\n    probe:\n      type: http\n      url: \"http://x/{key}\"\n"
	const sc = head + "      self_check:\n"
	long := strings.Repeat("k", MaxCanaryKeyLen+1)
	for _, tt := range []struct{ name, yaml, want string }{
		{"canary without key", sc + "        canaries:\n          - request: {ref: r}\n", `lk.yaml:8: tools.tickets.probe.self_check.canaries[0].key: required`},
		{"canary with an empty key", sc + "        canaries:\n          - key: \"\"\n", `lk.yaml:8: tools.tickets.probe.self_check.canaries[0].key: required`},
		{"canary key too long", sc + "        canaries:\n          - key: " + long + "\n", `lk.yaml:8: tools.tickets.probe.self_check.canaries[0].key: longer than 128 characters`},
		{"canary key twice", sc + "        canaries:\n          - key: c-1\n          - key: c-2\n          - key: c-1\n", `lk.yaml:10: tools.tickets.probe.self_check.canaries[2].key: key "c-1" given twice (also canaries[0])`},
		{"canary request a list", sc + "        canaries:\n          - key: c-1\n            request: [1, 2]\n", `lk.yaml:9: tools.tickets.probe.self_check.canaries[0].request: expected a mapping (a JSON object), got a list`},
		{"canary request a string", sc + "        canaries:\n          - key: c-1\n            request: \"{\\\"ref\\\":1}\"\n", `lk.yaml:9: tools.tickets.probe.self_check.canaries[0].request: expected a mapping (a JSON object), got "{\"ref\":1}"`},
		{"canary request member twice", sc + "        canaries:\n          - key: c-1\n            request:\n              ref: a\n              ref: b\n", `lk.yaml:11: tools.tickets.probe.self_check.canaries[0].request.ref: key given twice`},
		{"canary request infinity", sc + "        canaries:\n          - key: c-1\n            request: {n: .inf}\n", `lk.yaml:9: tools.tickets.probe.self_check.canaries[0].request.n: .inf is not a JSON number`},
		{"canary request unset variable", sc + "        canaries:\n          - key: c-1\n            request: {ref: \"${NOPE}\"}\n", `lk.yaml:9: tools.tickets.probe.self_check.canaries[0].request.ref: environment variable NOPE is not set`},
		{"canary misspelt", sc + "        canaries:\n          - keys: c-1\n", `lk.yaml:8: tools.tickets.probe.self_check.canaries[0].keys: unknown key (did you mean "key"?)`},
		{"canaries not a list", sc + "        canaries: {key: c-1}\n", `lk.yaml:7: tools.tickets.probe.self_check.canaries: expected a list, got a mapping`},
		{"require_witness not a boolean", sc + "        require_witness: maybe\n", `lk.yaml:7: tools.tickets.probe.self_check.require_witness: expected true or false, got "maybe"`},
		{"not_found_body a string", head + "      not_found_body: error.code\n", `lk.yaml:6: tools.tickets.probe.not_found_body: expected a mapping, got "error.code"`},
		{"not_found_body misspelt", head + "      not_found_body: {path: error.code, equal: x}\n", `lk.yaml:6: tools.tickets.probe.not_found_body.equal: unknown key (did you mean "equals"?)`},
		{"not_found_on_404 a list", head + "      not_found_on_404: [json]\n", `lk.yaml:6: tools.tickets.probe.not_found_on_404: expected a single value, got a list`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("lk.yaml", []byte(tt.yaml), env(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

// TestCanaryRequestSecretsAreRedacted: a value a ${VAR} put in a canary's
// request is registered with the redactor, as in any text setting.
func TestCanaryRequestSecretsAreRedacted(t *testing.T) {
	y := "tools:\n  tickets:\n    probe:\n      type: http\n      url: \"http://x/{key}\"\n      self_check:\n        canaries:\n          - key: c-1\n            request: {token: \"${TOKEN}\"}\n"
	c, err := Parse("lk.yaml", []byte(y), env(map[string]string{"TOKEN": "tok-very-secret"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Redactor().String("sent tok-very-secret"); strings.Contains(got, "tok-very-secret") {
		t.Fatalf("redacted: %q", got)
	}
}
