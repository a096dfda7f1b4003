package slacktest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
	"github.com/slack-go/slack"
)

// SocketMode is the server's Socket Mode side: apps.connections.open
// (with the app-level token) answers a ws:// URL on the same server, where
// each connection is greeted with hello, pinged as Slack pings, given the
// envelopes a test delivers, and its acknowledgements are collected.
// https://api.slack.com/apis/socket-mode
type SocketMode struct {
	s        *Server
	appToken string

	mu      sync.Mutex
	conns   map[int]*smConn
	next    int
	opened  int // connections ever opened
	acks    []Ack
	handler sync.WaitGroup // connection handlers, for the cleanup
}

// Ack is one acknowledgement a Socket Mode client sent.
type Ack struct {
	// Conn is the connection it came on (SocketMode.Conns).
	Conn       int
	EnvelopeID string
	// Payload is the acknowledgement's payload (null or absent: an empty
	// acknowledgement).
	Payload json.RawMessage
	// At is when it arrived.
	At time.Time
}

type smConn struct {
	ws *websocket.Conn
	// wmu serialises writes (gorilla/websocket allows one writer).
	wmu sync.Mutex
}

// pingEvery is how often a connection is pinged: Slack pings, and
// slack-go takes a connection without pings for dead.
const pingEvery = 500 * time.Millisecond

// SocketMode turns on Socket Mode: apps.connections.open accepts appToken
// ("" accepts any token) and its connections are closed when the test ends.
// Call it before a client connects; calling it again returns the same one.
func (s *Server) SocketMode(t testing.TB, appToken string) *SocketMode {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.socket != nil {
		return s.socket
	}
	m := &SocketMode{s: s, appToken: appToken, conns: map[int]*smConn{}}
	s.socket = m
	t.Cleanup(m.close)
	return m
}

// serveSocketMode answers apps.connections.open and the WebSocket
// upgrades once SocketMode was called; false for every other request.
func (s *Server) serveSocketMode(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	m := s.socket
	s.mu.Unlock()
	if m == nil {
		return false
	}
	switch {
	case r.URL.Path == "/api/apps.connections.open":
		m.open(w, r)
		return true
	case strings.HasPrefix(r.URL.Path, "/socket-mode/"):
		m.serveConn(w, r)
		return true
	}
	return false
}

func (m *SocketMode) open(w http.ResponseWriter, r *http.Request) {
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	m.s.record(Call{Method: "apps.connections.open", Token: token})
	w.Header().Set("Content-Type", "application/json")
	if m.appToken != "" && token != m.appToken {
		_ = json.NewEncoder(w).Encode(fail("invalid_auth"))
		return
	}
	m.mu.Lock()
	m.next++
	id := m.next
	m.mu.Unlock()
	u := "ws" + strings.TrimPrefix(m.s.srv.URL, "http") + "/socket-mode/" + strconv.Itoa(id) + "?ticket=t" + strconv.Itoa(id)
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "url": u})
}

var upgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

// serveConn runs one connection: hello, pings, and reading its acks until
// either side closes it.
func (m *SocketMode) serveConn(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/socket-mode/"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade answered the client
	}
	c := &smConn{ws: ws}
	m.mu.Lock()
	if m.conns == nil { // closed meanwhile: the test is over
		m.mu.Unlock()
		_ = ws.Close()
		return
	}
	m.conns[id] = c
	m.opened++
	m.handler.Add(1)
	m.mu.Unlock()
	defer m.handler.Done()
	defer func() {
		m.mu.Lock()
		delete(m.conns, id)
		m.mu.Unlock()
		_ = ws.Close()
	}()
	if err := c.write(map[string]any{
		"type": "hello", "num_connections": 1,
		"connection_info": map[string]any{"app_id": "A0SLACKTEST"},
		"debug_info":      map[string]any{"host": "slacktest", "approximate_connection_time": 3600},
	}); err != nil {
		return
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		tick := time.NewTicker(pingEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if ws.WriteControl(websocket.PingMessage, []byte("ping"), time.Now().Add(time.Second)) != nil {
					return
				}
			}
		}
	}()
	for {
		_, raw, err := ws.ReadMessage()
		if err != nil {
			return
		}
		at := time.Now()
		var a struct {
			EnvelopeID string          `json:"envelope_id"`
			Payload    json.RawMessage `json:"payload"`
		}
		if json.Unmarshal(raw, &a) != nil || a.EnvelopeID == "" {
			continue
		}
		m.mu.Lock()
		m.acks = append(m.acks, Ack{Conn: id, EnvelopeID: a.EnvelopeID, Payload: a.Payload, At: at})
		m.mu.Unlock()
	}
}

func (c *smConn) write(v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return c.ws.WriteJSON(v)
}

// close ends every connection and waits for their handlers.
func (m *SocketMode) close() {
	m.mu.Lock()
	conns := m.conns
	m.conns = nil
	m.mu.Unlock()
	for _, c := range conns {
		_ = c.ws.Close()
	}
	m.handler.Wait()
}

// Conns returns the IDs of the open connections, oldest first.
func (m *SocketMode) Conns() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []int
	for id := range m.conns {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Opened is how many connections were ever opened (reconnects count).
func (m *SocketMode) Opened() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.opened
}

// WaitConns waits up to timeout for n open connections and returns their
// IDs (failing the test when they do not come).
func (m *SocketMode) WaitConns(t testing.TB, n int, timeout time.Duration) []int {
	t.Helper()
	return waitFor(t, timeout, m.Conns, n, "Socket Mode connection(s)")
}

// waitFor polls get until it returns at least n items, or fails the test
// after timeout (testwait.Eventually).
func waitFor[T any](t testing.TB, timeout time.Duration, get func() []T, n int, what string) []T {
	t.Helper()
	testwait.Eventually(t, func() bool { return len(get()) >= n }, timeout, fmt.Sprintf("%d %s", n, what))
	return get()
}

// Deliver sends an interactive envelope with envelopeID and payload cb on
// connection conn, as Slack delivers a click to an app in Socket Mode.
func (m *SocketMode) Deliver(t testing.TB, conn int, envelopeID string, cb slack.InteractionCallback) {
	t.Helper()
	payload, err := json.Marshal(&cb)
	if err != nil {
		t.Fatalf("slacktest: encode interaction: %v", err)
	}
	m.send(t, conn, map[string]any{
		"type": "interactive", "envelope_id": envelopeID, "accepts_response_payload": true,
		"payload": json.RawMessage(payload),
	})
}

// Disconnect asks the client on conn to reconnect, as Slack does before it
// recycles a connection.
func (m *SocketMode) Disconnect(t testing.TB, conn int) {
	t.Helper()
	m.send(t, conn, map[string]any{"type": "disconnect", "reason": "refresh_requested"})
}

func (m *SocketMode) send(t testing.TB, conn int, msg map[string]any) {
	t.Helper()
	m.mu.Lock()
	c := m.conns[conn]
	m.mu.Unlock()
	if c == nil {
		t.Fatalf("slacktest: no open Socket Mode connection %d", conn)
	}
	if err := c.write(msg); err != nil {
		t.Fatalf("slacktest: write to Socket Mode connection %d: %v", conn, err)
	}
}

// Acks returns the acknowledgements received so far, in order (of the
// given envelope IDs only, when any are given).
func (m *SocketMode) Acks(envelopeIDs ...string) []Ack {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Ack
	for _, a := range m.acks {
		if len(envelopeIDs) == 0 || slices.Contains(envelopeIDs, a.EnvelopeID) {
			out = append(out, a)
		}
	}
	return out
}

// WaitAcks waits up to timeout for n acknowledgements of envelopeID and
// returns them (failing the test when they do not come).
func (m *SocketMode) WaitAcks(t testing.TB, envelopeID string, n int, timeout time.Duration) []Ack {
	t.Helper()
	return waitFor(t, timeout, func() []Ack { return m.Acks(envelopeID) }, n, "acknowledgement(s) of envelope "+envelopeID)
}
