package conformance_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// draftServer is an idempotency-key server written from
// draft-ietf-httpapi-idempotency-key-header-07 alone, sharing nothing with
// package ledger: its own store (in memory), the key parsed as a Structured
// Field String, its own fingerprint (a checksum of the whole payload, one
// of the draft's fingerprint choices), a replay that is the stored status and body
// again with no marker at all, 409 while the first request runs, 422 for
// the key with another payload, 400 without a key. A failure (5xx) is not
// stored: the key is forgotten, and a retry runs again. Its effects are
// tickets in the example tool's sink, which the probe reads.
//
// The fields after sink break it on purpose.
type draftServer struct {
	sink *pgxpool.Pool
	// slow is the processing time of a request titled "slow".
	slow time.Duration
	// cache5xx stores a failure and replays it, as a library that stores
	// every outcome does.
	cache5xx bool
	// fixed5xx makes every failure's body the same (no error id).
	fixed5xx bool
	// rawKeys takes the header's bytes as the key, quotes included.
	rawKeys bool

	mu     sync.Mutex
	keys   map[string]*draftEntry
	errIDs atomic.Int64
}

type draftEntry struct {
	sum    [32]byte
	done   bool
	status int
	body   []byte
}

// sfStringValue parses an RFC 8941 sf-string (§4.2.5): DQUOTE, printable
// ASCII with `\"` and `\\` escapes, DQUOTE.
func sfStringValue(v string) (string, error) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", errors.New("not a Structured Field String")
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v)-1 || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New("bad escape in a Structured Field String")
			}
			b.WriteByte(v[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", errors.New("bad character in a Structured Field String")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func (s *draftServer) problem(w http.ResponseWriter, code int, title string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"type":"https://tickets.example/idempotency","title":%q}`, title)
}

func (s *draftServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	header := r.Header.Get("Idempotency-Key")
	if header == "" {
		s.problem(w, http.StatusBadRequest, "Idempotency-Key is missing")
		return
	}
	key := header
	if !s.rawKeys {
		var err error
		if key, err = sfStringValue(header); err != nil {
			s.problem(w, http.StatusBadRequest, "Idempotency-Key: "+err.Error())
			return
		}
	}
	payload, err := io.ReadAll(r.Body)
	if err != nil {
		s.problem(w, http.StatusBadRequest, "unreadable body")
		return
	}
	sum := sha256.Sum256(payload)
	s.mu.Lock()
	e, seen := s.keys[key]
	switch {
	case seen && e.sum != sum:
		s.mu.Unlock()
		s.problem(w, http.StatusUnprocessableEntity, "Idempotency-Key is already used")
		return
	case seen && !e.done:
		s.mu.Unlock()
		s.problem(w, http.StatusConflict, "A request is outstanding for this Idempotency-Key")
		return
	case seen:
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.status)
		_, _ = w.Write(e.body)
		return
	}
	e = &draftEntry{sum: sum}
	s.keys[key] = e
	s.mu.Unlock()

	status, body := s.execute(r, key, payload)
	s.mu.Lock()
	if status >= 500 && !s.cache5xx {
		delete(s.keys, key)
	} else {
		e.done, e.status, e.body = true, status, body
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (s *draftServer) execute(r *http.Request, key string, payload []byte) (int, []byte) {
	// The work runs to its end whether or not the client still waits.
	ctx := context.WithoutCancel(r.Context())
	var req struct {
		Title     string `json:"title"`
		AccountID string `json:"account_id"`
	}
	if err := json.Unmarshal(payload, &req); err != nil || req.Title == "" {
		return http.StatusBadRequest, []byte(`{"error":"title is required"}`)
	}
	switch req.Title {
	case "fail":
		id := s.errIDs.Add(1)
		if s.fixed5xx {
			id = 0
		}
		return http.StatusBadGateway, fmt.Appendf(nil, `{"error":"ticket store failed","error_id":"E-%d"}`, id)
	case "slow":
		t := time.NewTimer(s.slow) // processing time, not a synchronisation
		<-t.C
	}
	var id string
	if err := s.sink.QueryRow(ctx, `INSERT INTO tickets (idempotency_key, title, account_id) VALUES ($1, $2, $3) RETURNING ticket_id`,
		key, req.Title, req.AccountID).Scan(&id); err != nil {
		return http.StatusServiceUnavailable, []byte(`{"error":"ticket store unavailable"}`)
	}
	return http.StatusCreated, fmt.Appendf(nil, `{"ticket_id":%q,"title":%q}`, id, req.Title)
}
