package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/mcpkey"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
)

// mcpAnswer is one tools/call outcome as the battery sees it.
type mcpAnswer struct {
	res *mcp.CallToolResult
	err error
}

func (a mcpAnswer) ok() bool       { return a.err == nil && a.res != nil && !a.res.IsError }
func (a mcpAnswer) replay() bool   { return a.ok() && a.res.Meta[mcpkey.MetaReplay] == true }
func (a mcpAnswer) inFlight() bool { return a.err == nil && a.res != nil && a.res.IsError }

func (a mcpAnswer) code() int64 {
	var e *jsonrpc.Error
	if errors.As(a.err, &e) {
		return e.Code
	}
	return 0
}

func (a mcpAnswer) String() string {
	switch {
	case a.err != nil:
		if c := a.code(); c != 0 {
			return fmt.Sprintf("JSON-RPC error %d: %s", c, excerpt([]byte(a.err.Error())))
		}
		return "no answer: " + a.err.Error()
	case a.res == nil:
		return "no result"
	case a.res.IsError:
		return "tool error " + excerpt(contentJSON(a.res))
	case a.replay():
		return "result (replay)"
	}
	return "result"
}

// contentJSON is the result's content and structured content, replay
// marker aside, as JSON.
func contentJSON(res *mcp.CallToolResult) []byte {
	if res == nil {
		return nil
	}
	b, err := json.Marshal(struct {
		Content    []mcp.Content `json:"content"`
		Structured any           `json:"structuredContent,omitempty"`
	}{res.Content, res.StructuredContent})
	if err != nil {
		return nil
	}
	return b
}

type mcpRunner struct {
	*runner
	cs *mcp.ClientSession
}

// runMCP runs the battery against the MCP tool cfg.MCPTool over streamable
// HTTP; the key goes in _meta.idempotencyKey.
func runMCP(ctx context.Context, r *runner) (Report, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "ledgerkeeper-conformance", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: r.cfg.URL, HTTPClient: r.cfg.Client, DisableStandaloneSSE: true}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	cs, err := client.Connect(cctx, tr, nil)
	cancel()
	if err != nil {
		r.record(Fail, "mcp/connect over streamable HTTP", "%v", err)
		return r.rep, nil
	}
	defer cs.Close()
	m := &mcpRunner{runner: r, cs: cs}
	for _, s := range []func(context.Context){r.probeControl, m.sameKeyTwice, m.otherArguments, m.concurrent, m.missingKey, m.clientDeadline} {
		if ctx.Err() != nil {
			return r.rep, fmt.Errorf("conformance interrupted: %w", ctx.Err())
		}
		s(ctx)
	}
	return r.rep, nil
}

func (m *mcpRunner) call(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) mcpAnswer {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := &mcp.CallToolParams{Name: m.cfg.MCPTool, Arguments: body}
	if key != "" {
		p.Meta = mcp.Meta{mcpkey.MetaKey: key}
	}
	res, err := m.cs.CallTool(ctx, p)
	return mcpAnswer{res: res, err: err}
}

func (m *mcpRunner) sameKeyTwice(ctx context.Context) {
	key := m.key("same-key-twice")
	first := m.call(ctx, key, m.cfg.Body, m.cfg.Timeout)
	second := m.call(ctx, key, m.cfg.Body, m.cfg.Timeout)
	m.check(first.ok() && !first.replay(), "same-key-twice/first call a result, not a replay", "%s", first)
	m.check(second.ok(), "same-key-twice/second call a result", "%s", second)
	m.check(second.replay(), "same-key-twice/second result has _meta[\""+mcpkey.MetaReplay+"\"] true", "%s", second)
	c1, c2 := string(contentJSON(first.res)), string(contentJSON(second.res))
	m.check(first.ok() && second.ok() && c1 == c2, "same-key-twice/identical content", "first %s, second %s", excerpt([]byte(c1)), excerpt([]byte(c2)))
	m.effect(ctx, "same-key-twice/one effect", key, m.cfg.Body, probes.Found)
}

func (m *mcpRunner) otherArguments(ctx context.Context) {
	key := m.key("other-arguments")
	first := m.call(ctx, key, m.cfg.Body, m.cfg.Timeout)
	other := m.call(ctx, key, m.cfg.OtherBody, m.cfg.Timeout)
	m.check(first.ok(), "other-arguments/first call a result", "%s", first)
	m.check(other.code() == jsonrpc.CodeInvalidParams, "other-arguments/the key with other arguments gets invalid params (-32602)", "%s", other)
	m.effect(ctx, "other-arguments/still one effect", key, m.cfg.Body, probes.Found)
}

func (m *mcpRunner) concurrent(ctx context.Context) {
	key := m.key("concurrent")
	n := m.cfg.Concurrency
	answers := together(n, func() mcpAnswer { return m.call(ctx, key, m.cfg.Body, m.cfg.Timeout) })
	firsts, inflight, replays := 0, 0, 0
	var others []string
	for _, a := range answers {
		switch {
		case a.replay():
			replays++
		case a.ok():
			firsts++
		case a.inFlight():
			inflight++
		default:
			others = append(others, a.String())
		}
	}
	seen := fmt.Sprintf("%d calls: %d first results, %d replays, %d in-flight tool errors", n, firsts, replays, inflight)
	if len(others) > 0 {
		seen += ", other answers: " + strings.Join(others[:min(len(others), 5)], "; ")
	}
	m.check(firsts == 1, "concurrent/exactly one call executed", "%s", seen)
	m.check(len(others) == 0, "concurrent/every other answer an in-flight tool error or a replay", "%s", seen)
	m.effect(ctx, "concurrent/exactly one effect", key, m.cfg.Body, probes.Found)
}

func (m *mcpRunner) missingKey(ctx context.Context) {
	const name = "missing-key/a call without _meta." + mcpkey.MetaKey + " gets invalid params (-32602)"
	if m.cfg.AllowMissingKey {
		m.record(Skip, name, "the tool accepts calls without a key (--allow-missing-key)")
		return
	}
	a := m.call(ctx, "", m.cfg.Body, m.cfg.Timeout)
	m.check(a.code() == jsonrpc.CodeInvalidParams, name, "%s", a)
}

func (m *mcpRunner) clientDeadline(ctx context.Context) {
	const prefix = "client-deadline/"
	if len(m.cfg.SlowBody) == 0 {
		m.record(Skip, prefix+"the retry after a client deadline is an in-flight tool error or a replay, never a second effect", "needs a slow-path call (--slow-body) that takes longer than the client deadline")
		return
	}
	key := m.key("client-deadline")
	first := m.call(ctx, key, m.cfg.SlowBody, m.cfg.SlowDeadline)
	if !m.check(errors.Is(first.err, context.DeadlineExceeded), prefix+"the slow call outlives the client deadline",
		"%s within %s", first, m.cfg.SlowDeadline) {
		return
	}
	retry := m.call(ctx, key, m.cfg.SlowBody, m.cfg.Timeout)
	m.check(retry.inFlight() || retry.replay(), prefix+"the immediate retry is an in-flight tool error (or a replay), not a second execution", "%s", retry)
	deadline := time.Now().Add(m.cfg.Settle)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := retry
	for last.inFlight() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		last = m.call(ctx, key, m.cfg.SlowBody, m.cfg.Timeout)
	}
	m.check(last.replay(), prefix+"once finished, a retry gets the stored result replayed", "%s", last)
	m.effect(ctx, prefix+"one effect", key, m.cfg.SlowBody, probes.Found)
}
