package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// Middleware defaults.
const (
	DefaultMaxRequestBytes = 1 << 20
	DefaultRetryAfter      = 2 * time.Second
)

// HeaderIdempotencyKey and HeaderReplayed are the contract's headers.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotency-Replayed"
)

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// DB is the ledger's pool. Required.
	DB DBTX
	// Tool is the tool name stored with every key. Required.
	Tool string
	// TTL sets expires_at = claim time + TTL. Default DefaultTTL.
	TTL time.Duration
	// RetryAfter is the Retry-After sent with 409. Default 2s.
	RetryAfter time.Duration
	// MaxRequestBytes bounds the request body. Default 1 MiB.
	MaxRequestBytes int64
	// HeartbeatInterval, when > 0, heartbeats the key while the handler
	// runs, so a slow but live attempt is never judged stuck. Keep it well
	// under the tool's heartbeat_timeout.
	HeartbeatInterval time.Duration
	// Logger receives errors the client cannot see. Default: discard.
	Logger *slog.Logger
}

// Envelope is the body every tool response carries: the tool's own response
// in OriginalResponse, and whether this answer is a replay.
type Envelope struct {
	OK               bool            `json:"ok"`
	IdempotentReplay bool            `json:"idempotent_replay"`
	OriginalResponse json.RawMessage `json:"original_response"`
}

// Problem is the body of every answer the middleware gives on its own
// behalf (never a tool's answer, which is always in an Envelope): an RFC 9457
// problem details object, sent as application/problem+json. Type is one of
// the stable Problem* URIs; clients branch on Type and Status, never on
// Title or Detail, which are for humans.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// ContentTypeProblem is the media type of a Problem body (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// The stable problem type URIs. They identify the problem, not a page that
// must be fetched; each is documented in the README.
const (
	ProblemBase              = "https://ledgerkeeper.dev/problems/"
	ProblemKeyMissing        = ProblemBase + "idempotency-key-missing"
	ProblemKeyTooLong        = ProblemBase + "idempotency-key-too-long"
	ProblemKeyInvalid        = ProblemBase + "idempotency-key-invalid"
	ProblemKeyReused         = ProblemBase + "idempotency-key-reused"
	ProblemKeyInFlight       = ProblemBase + "idempotency-key-in-flight"
	ProblemBodyInvalid       = ProblemBase + "request-body-invalid"
	ProblemBodyTooLarge      = ProblemBase + "request-body-too-large"
	ProblemLedgerUnavailable = ProblemBase + "ledger-unavailable"
	ProblemInternal          = ProblemBase + "internal-error"
)

func problem(w http.ResponseWriter, code int, typ, title, detail string) {
	write(w, code, ContentTypeProblem, Problem{Type: typ, Title: title, Status: code, Detail: detail})
}

// Middleware implements the tool side of the idempotency contract around a
// tool handler:
//
//   - no Idempotency-Key → 400; a key over 128 bytes → 400; a body that is
//     not JSON → 400; a body over MaxRequestBytes → 413;
//   - the key used with other arguments → 422;
//   - the key in flight → 409 with Retry-After;
//   - the key completed → the stored status and body in an Envelope with
//     idempotent_replay true and Idempotency-Replayed: true;
//   - otherwise the handler runs once (Run: the Attempt in its context,
//     heartbeats if HeartbeatInterval > 0); a definitive answer
//     (Definitive: below 500, but not 408, 425 or 429) is stored in the
//     same row, and the answer is returned in an Envelope with
//     idempotent_replay false. Any other status, a panic or a crash
//     stores nothing: the key stays processing for the reconciler, never
//     a cached 500 or 429.
//
// Every answer the middleware gives on its own behalf (400, 413, 422, 409,
// 503) is a Problem (application/problem+json, RFC 9457) with a stable type
// URI; tool answers and replays are always an Envelope (application/json).
// The handler writes its own JSON response (status and body) as usual.
func Middleware(cfg MiddlewareConfig, next http.Handler) http.Handler {
	if cfg.DB == nil || cfg.Tool == "" {
		panic("ledger: Middleware needs DB and Tool")
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := HeaderKey(r.Context(), cfg.DB, r.Header.Get(HeaderIdempotencyKey))
		switch {
		case err != nil && !errors.Is(err, ErrKeyHeaderInvalid):
			cfg.Logger.Error("read the ledger for a quoted key", "err", err)
			problem(w, http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Idempotency ledger unavailable",
				"the key could not be claimed, so the operation did not run; retry with the same Idempotency-Key")
			return
		case err != nil:
			problem(w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency-Key is not a valid Structured Field String",
				`a quoted Idempotency-Key must be an RFC 8941 String: printable ASCII between double quotes, with \" and \\ the only escapes (or send the bare key, unquoted)`)
			return
		case key == "":
			problem(w, http.StatusBadRequest, ProblemKeyMissing, "Idempotency-Key is missing",
				"this operation requires an Idempotency-Key header; derive it from the durable step that makes the call (for example {workflowRunId}:{stepId}), never mint a new one per retry")
			return
		case len(key) > MaxKeyLength:
			problem(w, http.StatusBadRequest, ProblemKeyTooLong, "Idempotency-Key is too long",
				fmt.Sprintf("the Idempotency-Key header is %d bytes; at most %d are accepted", len(key), MaxKeyLength))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cfg.MaxRequestBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				problem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
					fmt.Sprintf("the request body exceeds %d bytes", cfg.MaxRequestBytes))
				return
			}
			problem(w, http.StatusBadRequest, ProblemBodyInvalid, "Request body unreadable", "the request body could not be read")
			return
		}
		canon, err := Canonical(body)
		if err != nil {
			problem(w, http.StatusBadRequest, ProblemBodyInvalid, "Request body is not JSON", "the request body must be exactly one JSON value")
			return
		}
		rec := &recorder{header: http.Header{}, code: http.StatusOK}
		res, err := Run(r.Context(), cfg.DB, Call{
			Key: key, Tool: cfg.Tool, Request: canon, TTL: cfg.TTL,
			HeartbeatInterval: cfg.HeartbeatInterval, Logger: cfg.Logger,
		}, func(ctx context.Context) Response {
			// A panic propagates (net/http aborts the connection) with the
			// key left processing: the effect may have happened.
			r := r.WithContext(ctx)
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(rec, r)
			out := rec.body.Bytes()
			if !json.Valid(out) {
				// Keep the outcome replayable: a non-JSON body is stored
				// as a JSON string.
				out, _ = json.Marshal(string(out))
			}
			return Response{Code: rec.code, Body: out}
		})
		if err != nil {
			cfg.Logger.Error("claim idempotency key", "tool", cfg.Tool, "err", err)
			problem(w, http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Idempotency ledger unavailable",
				"the key could not be claimed, so the operation did not run; retry with the same Idempotency-Key")
			return
		}
		switch res.Claim {
		case FingerprintMismatch:
			problem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency-Key reused with other arguments",
				"this Idempotency-Key was first used with a different request body; the operation did not run again. A new operation needs a new key")
			return
		case InFlight:
			secs := int((cfg.RetryAfter + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			problem(w, http.StatusConflict, ProblemKeyInFlight, "Idempotency-Key in flight",
				fmt.Sprintf("a request with this Idempotency-Key is still being processed; retry the same request after %d seconds", secs))
			return
		case Replay:
			w.Header().Set(HeaderReplayed, "true")
			writeJSON(w, res.Response.Code, Envelope{OK: res.Response.Code < 400, IdempotentReplay: true, OriginalResponse: orNull(res.Response.Body)})
			return
		}
		for k, v := range rec.header {
			if k != "Content-Length" {
				w.Header()[k] = v
			}
		}
		writeJSON(w, rec.code, Envelope{OK: rec.code < 400, IdempotentReplay: false, OriginalResponse: res.Response.Body})
	})
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	write(w, code, "application/json", v)
}

func write(w http.ResponseWriter, code int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, contentType = http.StatusInternalServerError, ContentTypeProblem
		b, _ = json.Marshal(Problem{Type: ProblemInternal, Title: "Response not encodable", Status: code, Detail: "the middleware could not encode its response"})
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// recorder captures the handler's response so it can be stored before it
// is sent.
type recorder struct {
	header      http.Header
	code        int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.code, r.wroteHeader = code, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.body.Write(b)
}
