package main

import (
	"strings"
	"testing"
)

// One run reports every configuration error, structural (unknown
// key, wrong type) and semantic (the services' validation) together, each
// with its line, and none that only echoes a key already in error.
func TestConfigErrorsInOneRun(t *testing.T) {
	t.Parallel()
	cfg := writeFile(t, "ledgerkeeper.yaml", `reconcile:
  batch_size: lots
  bogus_key: 1
  concurrency: -3
tools:
  create_ticket:
    processing_window: 10x
    probe:
      type: carrier_pigeon
`)
	code, out, stderr := cli(t, "config", "check", "--config", cfg)
	if code != exitUsage || out != "" {
		t.Fatalf("config check: %d\n%s\n%s", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	want := []string{
		":2: reconcile.batch_size: expected an integer",
		":3: reconcile.bogus_key: unknown key",
		":4: reconcile.concurrency:",
		":7: tools.create_ticket.processing_window: bad duration",
		":9: tools.create_ticket.probe.type:",
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if strings.Count(stderr, "reconcile.batch_size") != 1 || strings.Count(stderr, "processing_window") != 1 {
		t.Errorf("an error repeated for a key already in error:\n%s", stderr)
	}
	if len(lines) > len(want)+1 { // + the "Run 'ledgerkeeper --help'" hint, if any
		t.Errorf("more errors than the file has:\n%s", stderr)
	}
}
