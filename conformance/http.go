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
// Idempotency-Key header (an sf-string or raw, Config.KeyFormat). It judges
// answers by the contract (status and body; 409 in flight; 422 and 400
// refusals) and reads ledger.Middleware's markers (idempotent_replay,
// Idempotency-Replayed) for the ledgerkeeper profile only.
type httpTransport struct {
	cfg Config

	mu   sync.Mutex
	seen []answer // every answer, for the ledgerkeeper profile's finally
}

func (t *httpTransport) terms() terms {
	return terms{
		unit:        "request",
		ok:          "answer 2xx",
		oks:         "answers 2xx",
		inFlight:    "a 409",
		inFlights:   "conflicts (409)",
		retry:       "gets 409",
		outcome:     "answer",
		replay:      "second answer is the first replayed (same status and body)",
		otherArgs:   "gets 422",
		missingKey:  "a request without " + ledger.HeaderIdempotencyKey + " gets 400",
		failure:     "a 5xx",
		failureNoun: "5xx",
		noCached:    "no-cached-5xx",
		failureHint: "a request id in the 5xx body tells them apart",
	}
}

func (t *httpTransport) headerKeys() bool { return true }

// stored is the request body as the tool side stores it: its canonical
// JSON.
func (t *httpTransport) stored(body json.RawMessage) json.RawMessage {
	c, err := ledger.Canonical(body)
	if err != nil {
		return body
	}
	return c
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

// reached: no answer at all, or a 404 or 405 (not the tool's endpoint),
// stops the run before any assertion.
func (t *httpTransport) reached(first reply) error {
	if first.err != nil {
		return notReached("cannot reach the tool endpoint %s: %v", redact(t.cfg.URL), first.err)
	}
	if c := first.status; c == http.StatusNotFound || c == http.StatusMethodNotAllowed {
		return notReached("POST %s answered %d %s %s: is it the tool's endpoint?", redact(t.cfg.URL), c, http.StatusText(c), first.shown)
	}
	return nil
}

// refused: the draft's 422 for another payload, 400 without a key.
func (t *httpTransport) refused(a reply, why refusal) (bool, *finding) {
	want := http.StatusUnprocessableEntity
	if why == refuseMissingKey {
		want = http.StatusBadRequest
	}
	return a.err == nil && a.status == want, nil
}

// finally (ledgerkeeper profile): no answer of the battery was a 5xx marked
// as a replay.
func (t *httpTransport) finally() []finding {
	t.mu.Lock()
	defer t.mu.Unlock()
	var bad []string
	for _, a := range t.seen {
		if a.err == nil && a.code >= 500 && a.marked() {
			bad = append(bad, fmt.Sprintf("%d %s", a.code, quote(a.raw)))
		}
	}
	seen := fmt.Sprintf("%d answers, none a 5xx marked as a replay", len(t.seen))
	if len(bad) > 0 {
		seen = fmt.Sprintf("%d of %d answers a 5xx marked as a replay, e.g. %s", len(bad), len(t.seen), bad[0])
	}
	return []finding{{name: "ledgerkeeper/no-cached-5xx/no answer is a 5xx marked as a replay", ok: len(bad) == 0, seen: seen}}
}

func (t *httpTransport) do(ctx context.Context, key string, body json.RawMessage) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		if t.cfg.KeyFormat == KeyFormatSFString {
			key = sfString(key)
		}
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

// marked: ledger.Middleware's envelope says this is a replay.
func (a answer) marked() bool { return a.envOK && a.env.IdempotentReplay }

func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	return fmt.Sprintf("%d", a.code)
}

// reply reads the answer for the battery: the contract judges its status
// and body; ledgerkeeper's two markers (the envelope's idempotent_replay
// and the Idempotency-Replayed header) are findings for its profile.
func (a answer) reply() reply {
	r := reply{
		err:      a.err,
		status:   a.code,
		ok:       a.err == nil && a.code >= 200 && a.code < 300,
		inFlight: a.err == nil && a.code == http.StatusConflict,
		failed:   a.err == nil && a.code >= 500,
		text:     a.String(),
		detail:   a.String(),
		marked:   a.marked(),
		markers: []finding{
			{name: "answer says idempotent_replay true", ok: a.marked(), seen: "body " + quote(a.raw)},
			{name: "answer carries the header " + ledger.HeaderReplayed + " true", ok: a.replayed == "true", seen: fmt.Sprintf("header %q", a.replayed)},
		},
	}
	if a.err != nil {
		r.shown = r.text
		return r
	}
	r.detail += " " + quote(a.raw)
	r.content = fmt.Sprintf("%d %s", a.code, normalise(a.raw))
	r.shown = fmt.Sprintf("%d %s", a.code, quote(a.raw))
	return r
}

// normalise is what a replay must reproduce of a body: its canonical JSON
// (member order and spacing aside), without a top-level idempotent_replay
// member (ledger.Middleware's marker: tolerated, never required); a body
// that is not JSON, byte for byte.
func normalise(raw []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil && m != nil {
		delete(m, "idempotent_replay")
		if b, err := json.Marshal(m); err == nil {
			raw = b
		}
	}
	if c, err := ledger.Canonical(raw); err == nil {
		return string(c)
	}
	return string(raw)
}
