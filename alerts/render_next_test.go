package alerts

import (
	"regexp"
	"strings"
	"testing"
)

var commandRE = regexp.MustCompile("(?m)(?:^|```)(ledgerkeeper [^\n`]*)")

// Every command a firing message suggests names the real key or tool and
// gives every flag the command requires; nothing says KEY or TOOL
// (issue 10 item 11). A worker's message has nothing of ledgerkeeper to
// run: it checks the worker, with the worker's real host and port.
func TestNextCommandsAreRunnable(t *testing.T) {
	r := newRenderer(testRunbook, 20)
	for _, reason := range Reasons {
		if reason == ReasonShardsUnreachable {
			worker := item{reason: reason, kind: KindFiring, details: Details{Node: "10.0.0.7:5432", Shards: []int64{102008}, LastError: "connection refused"}}
			_, texts := messageTexts(t, r.render(KindFiring, reason, []item{worker}, fixtureNow))
			all := strings.Join(texts, "\n")
			if cmds := commandRE.FindAllString(all, -1); len(cmds) != 0 || regexp.MustCompile(`\b(KEY|TOOL|HOST|PORT)\b`).MatchString(all) ||
				!strings.Contains(all, "```# on the coordinator, in psql:\nSELECT * FROM citus_check_cluster_node_health();\n# from a host that reaches the worker:\npg_isready -h 10.0.0.7 -p 5432```") {
				t.Errorf("%s: want the worker's checks, with its host and port, and no command of ledgerkeeper:\n%s", reason, all)
			}
			continue
		}
		items := []item{{reason: reason, kind: KindFiring, tool: "create_ticket", key: "wf-9:step-2",
			details: Details{Attempts: 3, Verdict: "unknown", LastError: "self-check: completed key wf-1 came back not_found"}}}
		if reason == ReasonDownstreamUnreachable || reason == ReasonProbeUntrusted {
			items[0].key = ""
		}
		_, texts := messageTexts(t, r.render(KindFiring, reason, items, fixtureNow))
		all := strings.Join(texts, "\n")
		if regexp.MustCompile(`\b(KEY|TOOL)\b`).MatchString(all) {
			t.Errorf("%s: a placeholder KEY or TOOL:\n%s", reason, all)
		}
		cmds := commandRE.FindAllStringSubmatch(all, -1)
		var acting int
		for _, m := range cmds {
			c := m[1]
			if strings.HasPrefix(c, "ledgerkeeper inspect ") || c == "ledgerkeeper status" {
				continue
			}
			acting++
			switch {
			case strings.HasPrefix(c, "ledgerkeeper resolve "):
				if !strings.HasPrefix(c, "ledgerkeeper resolve wf-9:step-2 ") || !strings.Contains(c, " --reason '") {
					t.Errorf("%s: %q lacks the key or --reason", reason, c)
				}
				if strings.Contains(c, "--completed") && (!strings.Contains(c, " --code ") || !strings.Contains(c, " --body ")) {
					t.Errorf("%s: %q lacks --code or --body", reason, c)
				}
			case strings.HasPrefix(c, "ledgerkeeper reconcile "):
				if c != "ledgerkeeper reconcile --key=wf-9:step-2" {
					t.Errorf("%s: %q", reason, c)
				}
			case strings.HasPrefix(c, "ledgerkeeper probe check "):
				if c != "ledgerkeeper probe check --tool=create_ticket" {
					t.Errorf("%s: %q", reason, c)
				}
			default:
				t.Errorf("%s: unexpected command %q", reason, c)
			}
		}
		if acting == 0 {
			t.Errorf("%s: no command to act on the alert:\n%s", reason, all)
		}
		if reason == ReasonNoProbe && strings.Contains(all, "last verdict") {
			t.Errorf("no_probe claims a verdict although no probe ran:\n%s", all)
		}
		if reason == ReasonProbeUntrusted && (!strings.Contains(all, "*Self-check answers:*") || strings.Contains(all, "Last probe error")) {
			t.Errorf("probe_untrusted evidence not labelled as self-check answers:\n%s", all)
		}
	}
}

// A key that looks like a flag goes after "--".
func TestNextCommandFlagLikeKey(t *testing.T) {
	got := nextCommands(item{reason: ReasonDedupWindowPassed, kind: KindFiring, tool: "t", key: "-rf x"})
	if !strings.Contains(got, "ledgerkeeper resolve --retryable --reason 'checked downstream: never happened' -- '-rf x'") {
		t.Errorf("got %q", got)
	}
}
