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
