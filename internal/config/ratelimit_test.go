package config

import (
	"strings"
	"testing"
)

// TestProbeRateLimit: tools.T.probe.rate_limit decodes rps and burst, and
// refuses what the prober cannot keep with file:line: key.
func TestProbeRateLimit(t *testing.T) {
	const head = "tools:\n  tickets:\n    probe:\n      type: http\n      url: \"http://x/{key}\"\n"
	c, err := Parse("lk.yaml", []byte(head+"      rate_limit: {rps: 100, burst: 10}\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if rl := c.Tools["tickets"].Probe.RateLimit; rl == nil || rl.RPS != 100 || rl.Burst != 10 {
		t.Fatalf("rate_limit = %+v, want rps 100 burst 10", rl)
	}
	c, err = Parse("lk.yaml", []byte(head+"      rate_limit:\n        rps: 0.5\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if rl := c.Tools["tickets"].Probe.RateLimit; rl.RPS != 0.5 || rl.Burst != 0 {
		t.Fatalf("rate_limit = %+v, want rps 0.5 and burst left to its default", rl)
	}
	if c, err := Parse("lk.yaml", []byte(head), env(nil)); err != nil || c.Tools["tickets"].Probe.RateLimit != nil {
		t.Fatalf("no rate_limit: %v, %+v; want none (unlimited)", err, c.Tools["tickets"].Probe)
	}

	for _, tt := range []struct{ name, yaml, want string }{
		{"zero rps", "      rate_limit: {rps: 0, burst: 5}\n", `lk.yaml:6: tools.tickets.probe.rate_limit.rps: must be a number of probes per second above 0, got 0`},
		{"negative rps", "      rate_limit:\n        rps: -3\n", `lk.yaml:7: tools.tickets.probe.rate_limit.rps: must be a number`},
		{"missing rps", "      rate_limit:\n        burst: 3\n", `lk.yaml:6: tools.tickets.probe.rate_limit.rps: must be a number`},
		{"infinite rps", "      rate_limit: {rps: .inf}\n", `tools.tickets.probe.rate_limit.rps: must be a number`},
		{"nan rps", "      rate_limit: {rps: NaN}\n", `tools.tickets.probe.rate_limit.rps: must be a number`},
		{"zero burst", "      rate_limit:\n        rps: 10\n        burst: 0\n", `lk.yaml:8: tools.tickets.probe.rate_limit.burst: must be at least 1, got 0`},
		{"negative burst", "      rate_limit: {rps: 10, burst: -1}\n", `tools.tickets.probe.rate_limit.burst: must be at least 1, got -1`},
		{"text rps", "      rate_limit: {rps: fast}\n", `tools.tickets.probe.rate_limit.rps: expected a number, got "fast"`},
		{"misspelled key", "      rate_limit: {rsp: 10}\n", `tools.tickets.probe.rate_limit.rsp: unknown key (did you mean "rps"?)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("lk.yaml", []byte(head+tt.yaml), env(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tt.want)
			}
		})
	}
}
