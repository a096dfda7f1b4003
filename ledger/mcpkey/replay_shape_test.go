package mcpkey

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// The replay rule, edge by edge: structuredContent only when the stored
// outcome is a JSON object that matches the tool's output schema (if it has
// one); else text only, the reason in _meta, and an error result for a tool
// with an output schema (the only result such a tool may return without
// structured content). What TypeScript clients do with each shape is pinned
// by the interop test in the daemon's module.
func TestReplayShapes(t *testing.T) {
	t.Parallel()
	schema, err := resolveOutputSchema(map[string]any{
		"type":       "object",
		"required":   []string{"refund_id"},
		"properties": map[string]any{"refund_id": map[string]any{"type": "string"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	const wrapStored = `{"content":[{"type":"text","text":"refund R-1"}],"structuredContent":{"refund_id":"R-1"}}`
	for _, tc := range []struct {
		name       string
		stored     string
		withSchema bool
		structured string // want structuredContent's JSON; "" for none
		texts      []string
		isError    bool
		why        string // a substring of _meta[MetaAsText]; "" for none
	}{
		{name: "object", stored: `{"ticket_id":"T-1"}`,
			structured: `{"ticket_id":"T-1"}`, texts: []string{`{"ticket_id":"T-1"}`}},
		{name: "string reads as its value", stored: `"ticket T-1 created"`,
			texts: []string{"ticket T-1 created"}, why: "a JSON string, and structuredContent must be a JSON object"},
		{name: "array", stored: `[1,2]`, texts: []string{`[1,2]`}, why: "a JSON array"},
		{name: "null", stored: `null`, texts: []string{`null`}, why: "JSON null"},
		{name: "no body", stored: ``, texts: []string{`null`}, why: "JSON null"},
		{name: "number", stored: `42`, texts: []string{`42`}, why: "a JSON number"},
		{name: "boolean", stored: `true`, texts: []string{`true`}, why: "a JSON boolean"},
		{name: "object matching the schema", stored: `{"refund_id":"R-1"}`, withSchema: true,
			structured: `{"refund_id":"R-1"}`, texts: []string{`{"refund_id":"R-1"}`}},
		{name: "object violating the schema", stored: `{"status":"refunded"}`, withSchema: true,
			texts: []string{"This call already completed", `{"status":"refunded"}`}, isError: true,
			why: "does not match the tool's outputSchema"},
		{name: "string for a tool with a schema", stored: `"refunded"`, withSchema: true,
			texts: []string{"This call already completed", "refunded"}, isError: true, why: "a JSON string"},
		{name: "stored result replayed as stored", stored: wrapStored, withSchema: true,
			structured: `{"refund_id":"R-1"}`, texts: []string{"refund R-1"}},
		{name: "stored result without structured content, tool with a schema",
			stored: `{"content":[{"type":"text","text":"refund R-1"}]}`, withSchema: true,
			texts: []string{"This call already completed", "refund R-1"}, isError: true, why: "no structured content"},
		{name: "stored result without structured content, tool without a schema",
			stored: `{"content":[{"type":"text","text":"refund R-1"}]}`, texts: []string{"refund R-1"}},
		{name: "stored result whose structured content is not an object",
			stored: `{"content":[{"type":"text","text":"x"}],"structuredContent":"x"}`,
			texts:  []string{"x"}, why: "a JSON string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := schema
			if !tc.withSchema {
				s = nil
			}
			res, err := replay(json.RawMessage(tc.stored), s)
			if err != nil {
				t.Fatal(err)
			}
			wire, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Meta              map[string]any `json:"_meta"`
				Content           []struct{ Text string }
				StructuredContent json.RawMessage `json:"structuredContent"`
				IsError           bool            `json:"isError"`
			}
			if err := json.Unmarshal(wire, &got); err != nil {
				t.Fatal(err)
			}
			if string(got.StructuredContent) != tc.structured {
				t.Errorf("structuredContent = %s, want %q (wire: %s)", got.StructuredContent, tc.structured, wire)
			}
			if len(got.Content) != len(tc.texts) {
				t.Fatalf("content = %+v, want %d texts %q", got.Content, len(tc.texts), tc.texts)
			}
			for i, want := range tc.texts {
				if !strings.Contains(got.Content[i].Text, want) {
					t.Errorf("content[%d] = %q, want it to contain %q", i, got.Content[i].Text, want)
				}
			}
			if got.IsError != tc.isError {
				t.Errorf("isError = %v, want %v", got.IsError, tc.isError)
			}
			if got.Meta[MetaReplay] != true {
				t.Errorf("_meta = %v, want %s true", got.Meta, MetaReplay)
			}
			why, _ := got.Meta[MetaAsText].(string)
			if tc.why == "" && why != "" || !strings.Contains(why, tc.why) {
				t.Errorf("_meta[%s] = %q, want %q", MetaAsText, why, tc.why)
			}
		})
	}
}

// An output schema that cannot be resolved is a mistake in the tool
// server's code: Wrap says so when it is built, not at the first replay.
func TestWrapRefusesUnresolvableOutputSchema(t *testing.T) {
	t.Parallel()
	defer func() {
		p := recover()
		if p == nil || !strings.Contains(p.(string), "OutputSchema") {
			t.Fatalf("Wrap with a broken schema: panic %v, want one naming OutputSchema", p)
		}
	}()
	Wrap(Config{DB: noDB{}, OutputSchema: map[string]any{"$ref": "#/$defs/missing"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) { return nil, nil })
}

// noDB is a ledger.DBTX never called: Wrap refuses before any call.
type noDB struct{ ledger.DBTX }
