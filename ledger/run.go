package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// completeTimeout bounds storing an outcome once the caller may be gone.
const completeTimeout = 10 * time.Second

// Call is one keyed call of a tool, as a transport (Middleware, package
// mcpkey) hands it to Run once it has read the key and the request.
type Call struct {
	// Key is the idempotency key, at most MaxKeyLength bytes. Required.
	Key string
	// Tool is the tool name stored with the key (the name the reconciler's
	// tools configuration knows). Required.
	Tool string
	// Request is the request in canonical form (Canonical): stored as
	// request_body for the probes, and hashed as it is into request_hash.
	Request json.RawMessage
	// TTL sets expires_at = claim time + TTL. Default DefaultTTL.
	TTL time.Duration
	// HeartbeatInterval, when > 0, heartbeats the key while the handler
	// runs, so a slow but live attempt is never judged stuck. Keep it well
	// under the tool's heartbeat_timeout. Default 0: no heartbeat.
	HeartbeatInterval time.Duration
	// Logger receives what the caller cannot see: a failed heartbeat, an
	// outcome that could not be stored. Default: discard.
	Logger *slog.Logger
}

// Response is a tool's answer to one call in the terms the stored-outcome
// rule (Definitive) judges: a status code and a JSON body, or a tool error
// with no status code to judge it by.
type Response struct {
	// Code is the answer's status: the HTTP status code, or 200 for an MCP
	// result that is not an error. Stored as response_code.
	Code int
	// Body is the answer as JSON, stored as response_body and replayed.
	Body json.RawMessage
	// IsError marks a failure that carries no status code: an MCP result
	// with isError set, a protocol error, no result at all, or a panic the
	// transport recovered. It is never a definitive outcome.
	IsError bool
}

// Definitive reports whether a tool's response is a definitive outcome: one
// that is stored with the key and replayed to every retry. It is the one
// stored-outcome rule of every transport.
//
// Stored: every status below 500 (2xx; business and validation 4xx such as
// 400, 404, 409 and 422; and the rare 1xx and 3xx a tool answers with),
// except the three 4xx that say "not now" rather than "no":
//
//   - 408 Request Timeout and 429 Too Many Requests: the server gave up or
//     shed the request, and the client is told to try again
//     (RFC 9110 §15.5.9, RFC 6585 §4);
//   - 425 Too Early: the request must be retried (RFC 8470 §5.2).
//
// Never stored: those three, every status from 500 up, and a tool error
// (Response.IsError). Whether the effect happened is then unknown, so the
// key stays processing for the reconciler, whose probe asks the downstream
// (or the handler calls Attempt.Abandon when it knows nothing happened);
// a retry meanwhile is told the key is in flight. Replaying such an answer
// forever would turn a moment's overload into a permanent failure.
func Definitive(r Response) bool {
	switch {
	case r.IsError, r.Code >= 500:
		return false
	case r.Code == http.StatusRequestTimeout, r.Code == http.StatusTooEarly, r.Code == http.StatusTooManyRequests:
		return false
	}
	return true
}

// Result is what Run did with one call.
type Result struct {
	// Claim is what the claim found. Only New ran the handler; the
	// transport answers Replay with Response, InFlight with "retry later"
	// and FingerprintMismatch with "this key was used with other
	// arguments".
	Claim Outcome
	// Response is, for New, the handler's response; for Replay, the stored
	// outcome (Code 200 when the row has none).
	Response Response
	// Stored reports whether Run stored the handler's response as the key's
	// outcome (New only): it was definitive and Complete succeeded.
	Stored bool
}

// Run applies the tool side of the idempotency contract to one call,
// whatever its transport: it claims call.Key, runs handler only when this
// call owns the key (with the Attempt in its context and, if asked, a
// heartbeat while it runs), and stores the handler's response with the key
// when Definitive says it is a definitive outcome. Transports translate the
// Result into their own answers.
//
// The heartbeat and the store outlive ctx's cancellation: a caller that
// gave up does not make a live attempt look dead, and an outcome whose
// effect happened is still recorded. A panic in handler propagates, with
// the key left processing (the effect may have happened). Run returns an
// error only when the key could not be claimed; handler did not run then.
func Run(ctx context.Context, db DBTX, call Call, handler func(ctx context.Context) Response) (Result, error) {
	logger := cmp.Or(call.Logger, discard)
	// The slim claim: Run reads the outcome, the hash, the stored response
	// and claimed_at, never the rest of the row.
	res, err := claimAs(ctx, db, ClaimParams{
		Key: call.Key, Tool: call.Tool, RequestHash: hashCanonical(call.Request), RequestBody: call.Request, TTL: call.TTL,
	}, claimSlim)
	if err != nil {
		return Result{}, err
	}
	switch res.Outcome {
	case Replay:
		code := http.StatusOK
		if res.Row.ResponseCode != nil {
			code = *res.Row.ResponseCode
		}
		return Result{Claim: Replay, Response: Response{Code: code, Body: res.Row.ResponseBody}}, nil
	case InFlight, FingerprintMismatch:
		return Result{Claim: res.Outcome}, nil
	}

	attempt := Attempt{Key: call.Key, Tool: call.Tool, ClaimedAt: res.Row.ClaimedAt, db: db}
	resp := attempt.run(ctx, call.HeartbeatInterval, logger, handler)
	out := Result{Claim: New, Response: resp}
	if !Definitive(resp) {
		return out, nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeTimeout)
	err = Complete(sctx, db, call.Key, attempt.ClaimedAt, resp.Code, resp.Body)
	cancel()
	if err != nil {
		// The effect happened but its record did not: the key stays
		// processing and the reconciler's probe will find it.
		logger.Error("store tool outcome", "tool", call.Tool, "code", resp.Code, "err", err)
		return out, nil
	}
	out.Stored = true
	return out, nil
}

var discard = slog.New(slog.DiscardHandler)

// run runs handler under a, with a in its context and a heartbeat every
// interval (none when interval <= 0) until it returns or panics.
func (a Attempt) run(ctx context.Context, interval time.Duration, logger *slog.Logger, handler func(context.Context) Response) Response {
	// The heartbeat follows the handler, not the caller.
	stop := a.heartbeatEvery(context.WithoutCancel(ctx), interval, logger)
	defer stop()
	return handler(context.WithValue(ctx, attemptKey{}, a))
}

// heartbeatEvery heartbeats a every interval until the returned stop is
// called; stop returns once the heartbeat goroutine has ended.
func (a Attempt) heartbeatEvery(ctx context.Context, interval time.Duration, logger *slog.Logger) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := a.Heartbeat(ctx); err != nil && ctx.Err() == nil {
					logger.Warn("heartbeat", "tool", a.Tool, "err", err)
				}
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// Attempt identifies the claim a handler runs under. Run puts it in the
// handler's context, whichever transport called Run; AttemptFromContext
// reads it back.
type Attempt struct {
	Key       string
	Tool      string
	ClaimedAt time.Time
	db        DBTX
}

// Heartbeat says the attempt is still working (see the package Heartbeat),
// for a handler that heartbeats at its own moments.
func (a Attempt) Heartbeat(ctx context.Context) error {
	return Heartbeat(ctx, a.db, a.Key, a.ClaimedAt)
}

// Abandon marks the attempt failed_retryable (see the package Abandon):
// call it only when the handler knows the effect did not happen, e.g. it
// refused the arguments before touching the downstream.
func (a Attempt) Abandon(ctx context.Context) error {
	return Abandon(ctx, a.db, a.Key, a.ClaimedAt)
}

type attemptKey struct{}

// AttemptFromContext returns the attempt Run claimed for the call whose
// handler has ctx: under Middleware and under package mcpkey alike.
func AttemptFromContext(ctx context.Context) (Attempt, bool) {
	a, ok := ctx.Value(attemptKey{}).(Attempt)
	return a, ok
}
