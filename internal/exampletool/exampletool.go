// Package exampletool is a small but real tool server: `create_ticket`
// writes a row to a `tickets` table (the sink tests count) behind
// ledger.Middleware, and `GET /v1/tickets?idempotency_key=K` lets a probe ask
// whether a ticket exists. Tests and `ledgerkeeper demo` use it.
package exampletool

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// Tool is the tool name the server claims keys under.
const Tool = "create_ticket"

// Schema creates the sink table.
const Schema = `CREATE TABLE IF NOT EXISTS tickets (
	id              bigserial PRIMARY KEY,
	ticket_id       text GENERATED ALWAYS AS ('T-' || id) STORED,
	idempotency_key text NOT NULL,
	title           text NOT NULL,
	account_id      text NOT NULL,
	created_at      timestamptz NOT NULL DEFAULT date_trunc('second', now())
)`

// Config wires the server.
type Config struct {
	// Ledger holds idempotency_keys; Sink holds tickets (may be the same).
	Ledger *pgxpool.Pool
	Sink   *pgxpool.Pool
	// Delay is the processing time of one ticket, slept after the ticket
	// is written (like a provision step waiting on a queue).
	Delay time.Duration
	// AfterEffect, if set, runs after the ticket is written and before the
	// response: tests panic here to simulate a crash.
	AfterEffect func(key string)
	// HeartbeatInterval is passed to the middleware.
	HeartbeatInterval time.Duration
	// RetryAfter is passed to the middleware.
	RetryAfter time.Duration
	Logger     *slog.Logger
}

// Server is the example tool server.
type Server struct{ cfg Config }

// New returns a server; call Migrate once to create the sink table.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg}
}

// Migrate creates the sink table.
func (s *Server) Migrate(ctx context.Context) error {
	_, err := s.cfg.Sink.Exec(ctx, Schema)
	return err
}

// Ticket is one row of the sink.
type Ticket struct {
	TicketID       string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	Title          string    `json:"title"`
	AccountID      string    `json:"account_id"`
	CreatedAt      time.Time `json:"created_at"`
}

// Handler serves POST /tools/create_ticket and GET /v1/tickets.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /tools/create_ticket", ledger.Middleware(ledger.MiddlewareConfig{
		DB: s.cfg.Ledger, Tool: Tool, Logger: s.cfg.Logger,
		HeartbeatInterval: s.cfg.HeartbeatInterval, RetryAfter: s.cfg.RetryAfter,
	}, http.HandlerFunc(s.createTicket)))
	mux.HandleFunc("GET /v1/tickets", s.listTickets)
	return mux
}

type createRequest struct {
	Title     string `json:"title"`
	AccountID string `json:"account_id"`
}

type createResponse struct {
	TicketID  string    `json:"ticket_id"`
	CreatedAt time.Time `json:"created_at"`
}

func (s *Server) createTicket(w http.ResponseWriter, r *http.Request) {
	attempt, _ := ledger.AttemptFromContext(r.Context())
	var req createRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Title == "" || req.AccountID == "" {
		// A validation failure is a definitive outcome: stored, replayed.
		reply(w, http.StatusBadRequest, map[string]string{"error": "title and account_id are required"})
		return
	}
	var resp createResponse
	err := s.cfg.Sink.QueryRow(r.Context(), `INSERT INTO tickets (idempotency_key, title, account_id) VALUES ($1, $2, $3)
		RETURNING ticket_id, created_at`, attempt.Key, req.Title, req.AccountID).Scan(&resp.TicketID, &resp.CreatedAt)
	if err != nil {
		reply(w, http.StatusInternalServerError, map[string]string{"error": "ticket store unavailable"})
		return
	}
	if s.cfg.AfterEffect != nil {
		s.cfg.AfterEffect(attempt.Key)
	}
	// The work goes on whether or not the client is still waiting, as a
	// real provision step would.
	time.Sleep(s.cfg.Delay)
	reply(w, http.StatusCreated, resp)
}

func (s *Server) listTickets(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	if key == "" {
		reply(w, http.StatusBadRequest, map[string]string{"error": "idempotency_key is required"})
		return
	}
	rows, err := s.cfg.Sink.Query(r.Context(), `SELECT ticket_id, idempotency_key, title, account_id, created_at
		FROM tickets WHERE idempotency_key = $1 ORDER BY id`, key)
	if err != nil {
		reply(w, http.StatusInternalServerError, map[string]string{"error": "ticket store unavailable"})
		return
	}
	tickets, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Ticket])
	if err != nil {
		reply(w, http.StatusInternalServerError, map[string]string{"error": "ticket store unavailable"})
		return
	}
	if tickets == nil {
		tickets = []Ticket{}
	}
	reply(w, http.StatusOK, map[string]any{"data": tickets})
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		panic(fmt.Sprintf("exampletool: encode: %v", err))
	}
}
