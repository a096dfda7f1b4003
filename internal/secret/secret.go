// Package secret is ledgerkeeper's one redactor. Every value that came into
// the configuration from ${VAR} expansion or a *_file twin is registered as
// a secret when the config loads; Redactor.String removes every registered
// value (and URL credentials, DSN passwords) from any text before it reaches
// a log, an error, an audit row, Slack or a command's output.
package secret

import (
	"cmp"
	"encoding/json"
	"slices"
	"strings"
	"sync"
)

// Mask replaces a redacted value.
const Mask = "[redacted]"

// Redactor removes registered secret values from text. The zero value and
// nil redact nothing but URL credentials. It is safe for concurrent use.
type Redactor struct {
	mu     sync.RWMutex
	values []string // longest first
}

// New returns an empty Redactor.
func New() *Redactor { return &Redactor{} }

// Register adds values to redact. Empty and very short values are ignored
// (redacting "1" would destroy every message).
func (r *Redactor) Register(values ...string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range values {
		if len(strings.TrimSpace(v)) < minLen || slices.Contains(r.values, v) {
			continue
		}
		r.values = append(r.values, v)
	}
	slices.SortFunc(r.values, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
}

// minLen is the shortest value registered.
const minLen = 4

// String returns s with every registered value replaced by Mask.
func (r *Redactor) String(s string) string {
	if r == nil || s == "" {
		return s
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, v := range r.values {
		s = strings.ReplaceAll(s, v, Mask)
	}
	return s
}

// JSON redacts every string of a JSON document. A document that is not
// valid JSON is returned as is by json.Valid's standard: callers pass only
// valid documents.
func (r *Redactor) JSON(doc json.RawMessage) json.RawMessage {
	if r == nil || len(doc) == 0 {
		return doc
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return doc
	}
	out, err := json.Marshal(r.walk(v))
	if err != nil {
		return doc
	}
	return out
}

func (r *Redactor) walk(v any) any {
	switch x := v.(type) {
	case string:
		return r.String(x)
	case []any:
		for i := range x {
			x[i] = r.walk(x[i])
		}
	case map[string]any:
		for k, el := range x {
			x[k] = r.walk(el)
		}
	}
	return v
}
