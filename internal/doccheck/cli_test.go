package doccheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// binary builds cmd/ledgerkeeper once per test run.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "doccheck")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "ledgerkeeper")
		build := exec.Command("go", "build", "-o", binPath, "./cmd/ledgerkeeper")
		build.Dir = filepath.Join("..", "..")
		buildOut, buildErr = build.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/ledgerkeeper: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

var (
	cmdRowRE  = regexp.MustCompile("(?m)^\\| `(ledgerkeeper [^`]+)`(?: / `([^`]+)`)?")
	flagRE    = regexp.MustCompile(`--[a-z][a-z0-9-]*`)
	subwordRE = regexp.MustCompile(`^[a-z][a-z-]*$`)
)

// commandPath is the sub-command words of a usage line: "ledgerkeeper
// probe run KEY [--tool T]" gives [probe run].
func commandPath(usage string) []string {
	var path []string
	for _, w := range strings.Fields(strings.TrimPrefix(usage, "ledgerkeeper ")) {
		if !subwordRE.MatchString(w) {
			break
		}
		path = append(path, w)
	}
	return path
}

// Every command and flag of the README's command table exists in the
// CLI: each command's --help lists each flag the table gives it (issue 10
// item 15). cmd/ledgerkeeper is a main package, so the test builds it and
// reads its help.
func TestREADMECommandTableMatchesCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := binary(t)
	rows := cmdRowRE.FindAllStringSubmatch(read(t, "README.md"), -1)
	if len(rows) < 10 {
		t.Fatalf("found %d command rows in README.md: has the table moved?", len(rows))
	}
	for _, row := range rows {
		for i, usage := range row[1:] {
			if usage == "" {
				continue
			}
			if i == 1 && !strings.HasPrefix(usage, "ledgerkeeper ") {
				usage = "ledgerkeeper " + usage // "/ `release KEY`"
			}
			path := commandPath(usage)
			help, err := exec.Command(bin, append(path, "--help")...).CombinedOutput()
			if err != nil {
				t.Errorf("%q: ledgerkeeper %s --help: %v\n%s", usage, strings.Join(path, " "), err, help)
				continue
			}
			if len(path) > 0 && !strings.Contains(string(help), "ledgerkeeper "+strings.Join(path, " ")) {
				t.Errorf("%q: no command %q (help:\n%s)", usage, strings.Join(path, " "), help)
				continue
			}
			for _, f := range flagRE.FindAllString(usage, -1) {
				if !regexp.MustCompile(`(?m)\s` + regexp.QuoteMeta(f) + `\b`).Match(help) {
					t.Errorf("README documents %s for %q; `ledgerkeeper %s --help` has no such flag", f, usage, strings.Join(path, " "))
				}
			}
		}
	}
}

var invocationRE = regexp.MustCompile("(?m)(?:`|^\\s*(?:\\$ )?)(ledgerkeeper [^`\\n|;&#)]*)")

// Every `ledgerkeeper …` command line the README, the runbook and
// deploy/README.md show names a real command and only flags it has.
func TestDocumentedInvocationsMatchCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := binary(t)
	helps := map[string]string{}
	help := func(path []string) (string, error) {
		k := strings.Join(path, " ")
		if h, ok := helps[k]; ok {
			return h, nil
		}
		out, err := exec.Command(bin, append(path, "--help")...).CombinedOutput()
		helps[k] = string(out)
		return string(out), err
	}
	n := 0
	for _, rel := range []string{"README.md", "runbook.md", "deploy/README.md"} {
		for _, m := range invocationRE.FindAllStringSubmatch(read(t, rel), -1) {
			usage := strings.TrimSpace(m[1])
			path := commandPath(usage)
			// Trailing words that are arguments (migrate up): keep the
			// longest prefix that is a command.
			var h string
			for len(path) > 0 {
				out, err := help(path)
				if err == nil && strings.Contains(out, "ledgerkeeper "+strings.Join(path, " ")) {
					h = out
					break
				}
				path = path[:len(path)-1]
			}
			if len(path) == 0 {
				// A line starting with "ledgerkeeper" may be prose; a code
				// span is a command.
				if strings.HasPrefix(m[0], "`") && len(strings.Fields(usage)) > 1 && subwordRE.MatchString(strings.Fields(usage)[1]) {
					t.Errorf("%s shows %q: no such command", rel, usage)
				}
				continue
			}
			n++
			for _, f := range flagRE.FindAllString(usage, -1) {
				if !regexp.MustCompile(`(?m)\s` + regexp.QuoteMeta(f) + `\b`).MatchString(h) {
					t.Errorf("%s shows %q: `ledgerkeeper %s` has no flag %s", rel, usage, strings.Join(path, " "), f)
				}
			}
		}
	}
	if n < 30 {
		t.Errorf("checked only %d command lines", n)
	}
}
