package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// httpTransport calls a tool endpoint with a POST per call, the key in the
// Idempotency-Key header; it reads the answers as ledger.Middleware writes
// them (an Envelope, the replay header, 409 in flight, 422 and 400 for
// refusals).
type httpTransport struct {
	cfg Config

	mu   sync.Mutex
	seen []answer // every answer, for no-cached-5xx
}

func (t *httpTransport) terms() terms {
	return terms{
		unit:         "request",
		ok:           "answer 2xx",
		firsts:       "first answers",
		inFlight:     "a 409",
		inFlights:    "conflicts (409)",
		retry:        "gets 409",
		deadlineSkip: "gets 409, never a second effect",
		outcome:      "outcome",
		identical:    "identical bodies after normalisation",
		otherArgs:    "gets 422",
		missingKey:   "a request without " + ledger.HeaderIdempotencyKey + " gets 400",

		otherArgsCode:  http.StatusUnprocessableEntity,
		missingKeyCode: http.StatusBadRequest,
	}
}

func (t *httpTransport) call(ctx context.Context, key string, body json.RawMessage, timeout time.Duration) reply {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a := t.do(ctx, key, body)
	t.mu.Lock()
	t.seen = append(t.seen, a)
	t.mu.Unlock()
	return a.reply()
}

// finally checks that no answer of the whole battery was a replayed 5xx.
func (t *httpTransport) finally() []finding {
	t.mu.Lock()
	defer t.mu.Unlock()
	var bad []string
	for _, a := range t.seen {
		if a.err == nil && a.code >= 500 && (a.replay() || a.replayed == "true") {
			bad = append(bad, fmt.Sprintf("%d %s", a.code, excerpt(a.raw)))
		}
	}
	seen := fmt.Sprintf("%d answers, none a replayed 5xx", len(t.seen))
	if len(bad) > 0 {
		seen = fmt.Sprintf("%d of %d answers a replayed 5xx, e.g. %s", len(bad), len(t.seen), bad[0])
	}
	return []finding{{name: "no-cached-5xx/a 5xx is never stored and replayed", ok: len(bad) == 0, seen: seen}}
}

func (t *httpTransport) do(ctx context.Context, key string, body json.RawMessage) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(ledger.HeaderIdempotencyKey, key)
	}
	resp, err := t.cfg.Client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{err: err}
	}
	a := answer{code: resp.StatusCode, replayed: resp.Header.Get(ledger.HeaderReplayed), raw: raw}
	var probe map[string]json.RawMessage
	if json.Unmarshal(raw, &probe) == nil && probe["idempotent_replay"] != nil {
		a.envOK = json.Unmarshal(raw, &a.env) == nil
	}
	return a
}

// answer is one HTTP answer.
type answer struct {
	code     int
	replayed string
	env      ledger.Envelope
	envOK    bool
	raw      []byte
	err      error
}

func (a answer) replay() bool { return a.envOK && a.env.IdempotentReplay }

func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	s := fmt.Sprintf("%d", a.code)
	if a.replay() {
		s += " replay"
	}
	return s
}

// reply reads the answer for the battery: a replay is marked twice, in the
// envelope and in the Idempotency-Replayed header.
func (a answer) reply() reply {
	r := reply{
		err:      a.err,
		ok:       a.err == nil && a.code >= 200 && a.code < 300,
		replay:   a.replay(),
		inFlight: a.err == nil && a.code == http.StatusConflict,
		code:     int64(a.code),
		text:     a.String(),
		detail:   a.String() + " " + excerpt(a.raw),
		markers: []finding{
			{name: "answer says idempotent_replay true", ok: a.replay(), seen: "envelope " + excerpt(a.raw)},
			{name: "answer carries the header " + ledger.HeaderReplayed + " true", ok: a.replayed == "true", seen: fmt.Sprintf("header %q", a.replayed)},
		},
	}
	n := normalise(a.raw)
	if n != "" {
		r.content = fmt.Sprintf("%d %s", a.code, n)
	}
	r.shown = fmt.Sprintf("%d %s", a.code, excerpt([]byte(n)))
	return r
}

// normalise returns the body's canonical JSON with the replay flag set
// aside ("" when the body is not JSON).
func normalise(raw []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil && m != nil {
		delete(m, "idempotent_replay")
		b, err := json.Marshal(m)
		if err != nil {
			return ""
		}
		raw = b
	}
	c, err := ledger.Canonical(raw)
	if err != nil {
		return ""
	}
	return string(c)
}
