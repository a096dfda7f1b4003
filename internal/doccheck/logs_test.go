package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var logMsgRE = regexp.MustCompile(`"msg":"([^"]+)"|msg="([^"]+)"`)

// Every log message the runbook tells on-call to grep for is one the code
// logs (issue 10 item 15).
func TestDocumentedLogMessagesExist(t *testing.T) {
	var src strings.Builder
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			src.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	code := src.String()
	n := 0
	for _, rel := range []string{"runbook.md", "README.md", "deploy/README.md"} {
		for _, m := range logMsgRE.FindAllStringSubmatch(read(t, rel), -1) {
			msg := m[1] + m[2]
			n++
			if !strings.Contains(code, `"`+msg) {
				t.Errorf("%s tells you to look for log message %q; no code logs it", rel, msg)
			}
		}
	}
	if n < 5 {
		t.Errorf("found only %d log messages in the docs", n)
	}
}
