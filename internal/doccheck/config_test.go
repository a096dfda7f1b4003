package doccheck

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	cfgRowRE  = regexp.MustCompile("(?m)^\\| (`[a-z_]+\\.[^|]*?) \\| ([^|]*) \\|")
	codeRE    = regexp.MustCompile("`([^`]+)`")
	minConfig = map[string]any{
		"database": map[string]any{"url": "postgres://u:p@localhost/db"},
		"tools":    map[string]any{"t1": map[string]any{"processing_window": "30s"}},
	}
)

// configKeys expands a README key cell: "`a.b` / `c`" is a.b and a.c,
// "<tool>" is a tool named t1.
func configKeys(cell string) []string {
	var keys []string
	prefix := ""
	for i, m := range codeRE.FindAllStringSubmatch(cell, -1) {
		k := strings.ReplaceAll(m[1], "<tool>", "t1")
		if i == 0 {
			prefix = k[:strings.LastIndexByte(k, '.')+1]
		} else if !strings.Contains(k, ".") {
			k = prefix + k
		}
		keys = append(keys, k)
	}
	return keys
}

func withKey(base map[string]any, key string, v any) map[string]any {
	out := deepCopy(base)
	m := out
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
	return out
}

func deepCopy(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			v = deepCopy(sub)
		}
		out[k] = v
	}
	return out
}

func lookupPath(doc map[string]any, key string) (any, bool) {
	var cur any = doc
	for _, p := range strings.Split(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// sameDefault compares a documented default with the effective value;
// ok is false when the cell is prose ("the window", "none").
func sameDefault(doc string, got any) (same, ok bool) {
	doc = strings.TrimSpace(doc)
	if d, err := time.ParseDuration(doc); err == nil {
		g, err := time.ParseDuration(fmt.Sprint(got))
		return err == nil && g == d, true
	}
	if strings.HasSuffix(doc, "d") {
		if n, err := strconv.Atoi(strings.TrimSuffix(doc, "d")); err == nil {
			g, err := time.ParseDuration(fmt.Sprint(got))
			return err == nil && g == time.Duration(n)*24*time.Hour, true
		}
	}
	if f, err := strconv.ParseFloat(doc, 64); err == nil {
		g, isNum := got.(float64)
		return isNum && g == f, true
	}
	if s, isStr := got.(string); isStr && (strings.HasPrefix(doc, "@") || strings.HasPrefix(doc, ":") || doc == "info" || doc == "text") {
		return s == doc, true
	}
	return false, false
}

// Every key of the README's configuration table is a key the loader knows,
// and every default it gives is the one `config check` reports (issue 10
// item 15).
func TestREADMEConfigTableMatchesLoader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := binary(t)
	dir := t.TempDir()
	run := func(doc map[string]any, args ...string) (string, error) {
		b, _ := json.Marshal(doc) // JSON is YAML
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, append([]string{"config", "check", "--config", path}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := run(minConfig, "--json")
	if err != nil {
		t.Fatalf("config check of a minimal configuration: %v\n%s", err, out)
	}
	var effective map[string]any
	if err := json.Unmarshal([]byte(out), &effective); err != nil {
		t.Fatalf("config check --json: %v\n%s", err, out)
	}

	rows := cfgRowRE.FindAllStringSubmatch(read(t, "README.md"), -1)
	if len(rows) < 30 {
		t.Fatalf("found %d configuration rows in README.md: has the table moved?", len(rows))
	}
	compared := 0
	defer func() {
		if compared < 30 {
			t.Errorf("compared only %d defaults: is the table's format understood?", compared)
		}
	}()
	for _, row := range rows {
		keys := configKeys(row[1])
		var defaults []string
		for _, m := range codeRE.FindAllStringSubmatch(row[2], -1) {
			defaults = append(defaults, m[1])
		}
		for i, key := range keys {
			out, _ := run(withKey(minConfig, key, "doccheck-value"))
			if strings.Contains(out, key+": unknown key") {
				t.Errorf("README documents %s; the loader says: %s", key, out)
				continue
			}
			got, found := lookupPath(effective, key)
			if !found || len(defaults) != len(keys) && len(defaults) != 1 {
				continue
			}
			doc := defaults[min(i, len(defaults)-1)]
			if len(defaults) == 1 && i > 0 {
				continue // "`x` / `y` | `d`": d is the first key's
			}
			same, ok := sameDefault(doc, got)
			if ok {
				compared++
			}
			if ok && !same {
				t.Errorf("README gives %s the default %q; config check reports %v", key, doc, got)
			}
		}
	}
}
