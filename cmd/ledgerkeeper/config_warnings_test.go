package main

import (
	"strings"
	"testing"
)

// `config check` names the valid but dangerous settings on stderr, with
// their file and line, and still exits 0; stdout stays the effective
// configuration (not_found_on_404 filled in as json when absent).
func TestConfigCheckWarnsOfDangerousAbsenceSettings(t *testing.T) {
	t.Parallel()
	const probe = "tools:\n  t:\n    probe:\n      type: http\n      url: \"http://tickets.internal/v1/tickets/{key}\"\n"
	risky := writeFile(t, "risky.yaml", probe+"      not_found_on_404: any\n      self_check:\n        require_witness: false\n")
	for _, args := range [][]string{{}, {"--json"}} {
		code, out, stderr := cli(t, append([]string{"config", "check", "--config", risky}, args...)...)
		if code != 0 {
			t.Fatalf("config check %v: exit %d\n%s", args, code, stderr)
		}
		for _, want := range []string{
			"warning: " + risky + ":6: tools.t.probe.not_found_on_404: any: every 404 counts as absence, even a router's or ingress's error page; only for an API whose 404s have no body\n",
			"warning: " + risky + ":8: tools.t.probe.self_check.require_witness: false: not_found verdicts are applied with no witness that the probe can find anything; a typo'd path answering 404 would mark keys retryable whose effect happened (dangerous)\n",
		} {
			if !strings.Contains(stderr, want) {
				t.Errorf("config check %v: stderr lacks %q:\n%s", args, want, stderr)
			}
		}
		if strings.Contains(out, "warning") {
			t.Errorf("config check %v: a warning on stdout:\n%s", args, out)
		}
	}

	safe := writeFile(t, "safe.yaml", probe)
	code, out, stderr := cli(t, "config", "check", "--config", safe)
	if code != 0 || strings.Contains(stderr, "warning") || !strings.Contains(out, "not_found_on_404: json") {
		t.Fatalf("config check of a safe probe: exit %d\n%s\n%s", code, out, stderr)
	}

	bad := writeFile(t, "bad.yaml", probe+"      not_found_on_404: always\n")
	code, _, stderr = cli(t, "config", "check", "--config", bad)
	if code != 2 || !strings.Contains(stderr, bad+`:6: tools.t.probe.not_found_on_404: must be json or any, got "always"`) {
		t.Fatalf("config check of not_found_on_404: always: exit %d\n%s", code, stderr)
	}
}
