package mcpkey

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaAsText is the _meta field of a replay whose stored outcome could not
// be sent as structuredContent: it says why (the outcome is not a JSON
// object, or it does not match the tool's output schema). The outcome is
// then in the result's text content only.
const MetaAsText = "ledgerkeeper/replayAsText"

// resolveOutputSchema resolves a tool's output schema (anything that
// marshals to a JSON Schema, as mcp.Tool.OutputSchema) for checking the
// structured content of replays. Nil: the tool declares none.
func resolveOutputSchema(s any) (*jsonschema.Resolved, error) {
	if s == nil {
		return nil, nil
	}
	schema, ok := s.(*jsonschema.Schema)
	if !ok {
		b, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		if string(b) == "null" {
			return nil, nil
		}
		schema = new(jsonschema.Schema)
		if err := json.Unmarshal(b, schema); err != nil {
			return nil, err
		}
	}
	if schema == nil {
		return nil, nil
	}
	return schema.Resolve(nil)
}

// replay answers with a stored outcome, in a shape every MCP client accepts
// (the TypeScript SDK's client parses structuredContent as an object and,
// for a tool with an output schema, validates it and requires it unless the
// result is an error).
//
// A body Wrap stored is a CallToolResult (an object with "content"): it is
// replayed as stored. Any other body was stored by the reconciler (from the
// probe's outcome) or by an operator (resolve, Slack's Store outcome): its
// text is the text content (a JSON string's own value, any other body's
// JSON), and the body itself the structured content.
//
// structuredContent is kept only when it is a JSON object and, if the tool
// declares an output schema, matches it; otherwise it is left out and
// _meta[MetaAsText] says why. A tool with an output schema whose replay
// carries no structured content is answered as an error result (the only
// shape such a tool may return without it), whose first text says the call
// already completed.
func replay(stored json.RawMessage, schema *jsonschema.Resolved) (*mcp.CallToolResult, error) {
	var out mcp.CallToolResult
	var structured json.RawMessage // what would be structuredContent; nil: none
	var shape map[string]json.RawMessage
	if json.Unmarshal(stored, &shape) == nil && shape["content"] != nil {
		if err := json.Unmarshal(stored, &out); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the stored result of this idempotency key cannot be replayed"}
		}
		out.StructuredContent = nil
		if sc, ok := shape["structuredContent"]; ok {
			structured = sc
		}
	} else {
		body := stored
		if len(body) == 0 {
			body = json.RawMessage("null")
		}
		out = mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: textOf(body)}}}
		structured = body
	}
	var why string
	if structured != nil {
		why = structuredProblem(structured, schema)
		if why == "" {
			out.StructuredContent = structured
		}
	} else if schema != nil {
		why = "the stored outcome has no structured content, and the tool declares an outputSchema"
	}
	if out.Meta == nil {
		out.Meta = mcp.Meta{}
	}
	out.Meta[MetaReplay] = true
	if why != "" {
		out.Meta[MetaAsText] = why
	}
	if schema != nil && out.StructuredContent == nil {
		out.IsError = true
		note := &mcp.TextContent{Text: "This call already completed: its effect happened, so it must not be made again under another key. " +
			"Its recorded outcome follows as text, because " + why + "."}
		out.Content = append([]mcp.Content{note}, out.Content...)
	}
	return &out, nil
}

// structuredProblem says why raw cannot be a result's structuredContent: it
// is not a JSON object (MCP requires one), or it does not match schema.
// Empty: it can.
func structuredProblem(raw json.RawMessage, schema *jsonschema.Resolved) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "the stored outcome is not valid JSON"
	}
	if _, ok := v.(map[string]any); !ok {
		return "the stored outcome is " + kindOf(v) + ", and structuredContent must be a JSON object"
	}
	if schema == nil {
		return ""
	}
	if err := schema.Validate(v); err != nil {
		return fmt.Sprintf("the stored outcome does not match the tool's outputSchema (%v)", err)
	}
	return ""
}

// kindOf names a decoded JSON value's kind, with its article.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "JSON null"
	case string:
		return "a JSON string"
	case []any:
		return "a JSON array"
	case bool:
		return "a JSON boolean"
	case float64:
		return "a JSON number"
	}
	return "not a JSON object"
}

// textOf is a stored body as a result's text: a JSON string's own value
// (an operator's "refunded" reads as refunded), any other body its JSON.
func textOf(body json.RawMessage) string {
	var s string
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '"' && json.Unmarshal(b, &s) == nil {
		return s
	}
	return string(body)
}
