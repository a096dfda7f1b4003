// Package slacktest is a Slack that tests can run: an httptest server
// speaking the Web API methods ledgerkeeper calls (chat.postMessage,
// chat.update, chat.postEphemeral, conversations.history, views.open,
// views.push) and response_url endpoints, keeping the messages it was given
// and recording every call; and the other direction, interaction requests
// signed with a signing secret as Slack signs them.
//
// It is a stand-in for the real API's shapes, not its rules: it checks the
// bot token when one is set and Slack's size limits that matter to
// ledgerkeeper (50 blocks, 3000-character private_metadata), nothing else.
// It can be slow (SetLatency: every answer after a delay, as a Slack under
// load) and flaky (FailNext: HTTP 503s, then answers again), so that tests
// can show what a client does about both.
package slacktest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slack-go/slack"
)

// Call is one request the server received.
type Call struct {
	// Method is the Web API method ("chat.update", "views.open"), or
	// "response_url" for a post to a response URL (ResponseID says which).
	Method     string
	ResponseID string
	// Token is the bearer token or form token the call carried.
	Token string
	// Form holds the fields of a form-encoded call; JSON the decoded body
	// of a JSON call (nil otherwise).
	Form url.Values
	JSON map[string]any
	// Raw is the body as received.
	Raw []byte
	// At is when the request arrived (before any SetLatency delay), and
	// Status the HTTP status it was answered with (200, or FailNext's 503).
	At     time.Time
	Status int
}

// Field returns a field of the call, from the form or the JSON body, as a
// string: JSON values other than strings are given as their JSON text.
func (c Call) Field(name string) string {
	if c.Form != nil {
		if v, ok := c.Form[name]; ok && len(v) > 0 {
			return v[0]
		}
	}
	v, ok := c.JSON[name]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	// As sent: no \u0026 for & (texts are compared with what was meant).
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

// Message is a message the server holds, as chat.postMessage or Post left
// it and chat.update changed it.
type Message struct {
	Channel string
	TS      string
	Text    string
	// Blocks is the JSON array of blocks.
	Blocks json.RawMessage
}

// Server is the fake Slack. The zero value is not usable: call New.
type Server struct {
	srv *httptest.Server
	// token, when set, is the only bot token accepted (invalid_auth
	// otherwise).
	token string

	mu       sync.Mutex
	calls    []Call
	messages map[string]*Message // channel + "/" + ts
	seq      int
	fail     map[string]string // method -> error code
	flaky    map[string]int    // method -> HTTP 503s still to answer
	latency  time.Duration     // how long every answer takes (SetLatency)
	socket   *SocketMode       // Socket Mode, once turned on (socketmode.go)
}

// New starts a server that accepts the bot token token ("" accepts any)
// and stops it when the test ends.
func New(t testing.TB, token string) *Server {
	s := &Server{token: token, messages: map[string]*Message{}, fail: map[string]string{}, flaky: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// URL is the server's base URL.
func (s *Server) URL() string { return s.srv.URL }

// APIURL is the Web API base for slack.OptionAPIURL (it ends in "/").
func (s *Server) APIURL() string { return s.srv.URL + "/api/" }

// ResponseURL is a response_url the server answers and records, named id.
func (s *Server) ResponseURL(id string) string { return s.srv.URL + "/response/" + url.PathEscape(id) }

// Client is a slack-go client of the server with the bot token token.
func (s *Server) Client(token string) *slack.Client {
	return slack.New(token, slack.OptionAPIURL(s.APIURL()), slack.OptionHTTPClient(s.srv.Client()))
}

// Fail makes every later call of method answer ok:false with code ("" to
// stop failing).
func (s *Server) Fail(method, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[method] = code
}

// FailNext makes the next n calls of method ("response_url" for posts to
// a response URL) answer HTTP 503 Service Unavailable, as Slack does when
// it is in trouble, changing nothing; the calls after them are answered as
// usual. Each failed call is recorded (Status 503).
func (s *Server) FailNext(method string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flaky[method] = n
}

// SetLatency makes every later answer (Web API methods, response URLs,
// apps.connections.open) take d: the request is held for d after it
// arrives, then recorded, applied and answered, as a Slack that is slow to
// answer. A client that gives up earlier (its context, its timeout) gets
// no answer and nothing is applied. 0 answers at once.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// delay holds a request for the latency set; false when the client gave
// up meanwhile (the request is then dropped, as if never received).
func (s *Server) delay(r *http.Request) bool {
	s.mu.Lock()
	d := s.latency
	s.mu.Unlock()
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// flake reports whether this call of method is one FailNext asked to fail.
func (s *Server) flake(method string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flaky[method] <= 0 {
		return false
	}
	s.flaky[method]--
	return true
}

// Post stores a message as if the app had posted it, and returns its ts.
func (s *Server) Post(channel, text string, blocks []slack.Block) string {
	raw, err := json.Marshal(blocks)
	if err != nil {
		panic(fmt.Sprintf("slacktest: encode blocks: %v", err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store(channel, text, raw)
}

func (s *Server) store(channel, text string, blocks json.RawMessage) string {
	s.seq++
	ts := fmt.Sprintf("1700000000.%06d", s.seq)
	s.messages[channel+"/"+ts] = &Message{Channel: channel, TS: ts, Text: text, Blocks: blocks}
	return ts
}

// Message returns the message at channel and ts as it stands.
func (s *Server) Message(channel, ts string) (Message, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.messages[channel+"/"+ts]
	if !ok {
		return Message{}, false
	}
	return *m, true
}

// Messages returns every message the server holds, in no order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Message, 0, len(s.messages))
	for _, m := range s.messages {
		out = append(out, *m)
	}
	return out
}

// Calls returns the calls of the given methods so far, in order (every
// call when none is given).
func (s *Server) Calls(methods ...string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.calls {
		if len(methods) == 0 || slices.Contains(methods, c.Method) {
			out = append(out, c)
		}
	}
	return out
}

// WaitCalls waits up to timeout for n calls of method and returns them
// (failing the test when they do not come).
func (s *Server) WaitCalls(t testing.TB, method string, n int, timeout time.Duration) []Call {
	t.Helper()
	return waitFor(t, timeout, func() []Call { return s.Calls(method) }, n, method+" call(s)")
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	// A Socket Mode WebSocket is not an answer: it is not held.
	if !strings.HasPrefix(r.URL.Path, "/socket-mode/") && !s.delay(r) {
		return
	}
	if s.serveSocketMode(w, r) {
		return
	}
	raw, _ := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	c := Call{Raw: raw, Token: strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), At: at, Status: http.StatusOK}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/json" {
		_ = json.Unmarshal(raw, &c.JSON)
	} else if form, err := url.ParseQuery(string(raw)); err == nil {
		c.Form = form
		if c.Token == "" {
			c.Token = form.Get("token")
		}
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/response/"); ok {
		c.Method, c.ResponseID = "response_url", id
		if s.flake(c.Method) {
			c.Status = http.StatusServiceUnavailable
			s.record(c)
			http.Error(w, "service unavailable", c.Status)
			return
		}
		s.record(c)
		s.applyResponseURL(c)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
		return
	}
	method, ok := strings.CutPrefix(r.URL.Path, "/api/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	c.Method = method
	if s.flake(c.Method) {
		c.Status = http.StatusServiceUnavailable
		s.record(c)
		http.Error(w, "service unavailable", c.Status)
		return
	}
	s.record(c)
	answer := s.answer(c)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(answer)
}

func (s *Server) record(c Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

// applyResponseURL replaces the original message when a response_url post
// says replace_original (the message is named by the response id's
// "channel/ts", as ResponseURLFor makes it).
func (s *Server) applyResponseURL(c Call) {
	if c.JSON["replace_original"] != true {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.messages[c.ResponseID]; ok {
		m.Text = c.Field("text")
		if b, err := json.Marshal(c.JSON["blocks"]); err == nil {
			m.Blocks = b
		}
	}
}

// ResponseURLFor is a response_url for the message at channel and ts: a
// post to it with replace_original changes that message.
func (s *Server) ResponseURLFor(channel, ts string) string {
	return s.srv.URL + "/response/" + channel + "/" + ts
}

func fail(code string) map[string]any { return map[string]any{"ok": false, "error": code} }

func (s *Server) answer(c Call) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.token != "" && c.Token != s.token {
		return fail("invalid_auth")
	}
	if code := s.fail[c.Method]; code != "" {
		return fail(code)
	}
	switch c.Method {
	case "chat.postMessage":
		blocks := json.RawMessage(c.Field("blocks"))
		if n, err := countBlocks(blocks); err != nil || n > 50 {
			return fail("invalid_blocks")
		}
		ts := s.store(c.Field("channel"), c.Field("text"), blocks)
		return map[string]any{"ok": true, "channel": c.Field("channel"), "ts": ts}
	case "chat.update":
		m, ok := s.messages[c.Field("channel")+"/"+c.Field("ts")]
		if !ok {
			return fail("message_not_found")
		}
		blocks := json.RawMessage(c.Field("blocks"))
		if n, err := countBlocks(blocks); err != nil || n > 50 {
			return fail("invalid_blocks")
		}
		m.Text, m.Blocks = c.Field("text"), blocks
		return map[string]any{"ok": true, "channel": m.Channel, "ts": m.TS, "text": m.Text}
	case "chat.postEphemeral":
		s.seq++
		return map[string]any{"ok": true, "message_ts": fmt.Sprintf("1700000001.%06d", s.seq)}
	case "conversations.history":
		m, ok := s.messages[c.Field("channel")+"/"+c.Field("latest")]
		if !ok {
			return map[string]any{"ok": true, "messages": []any{}, "has_more": false}
		}
		return map[string]any{"ok": true, "has_more": false, "messages": []any{map[string]any{
			"type": "message", "ts": m.TS, "text": m.Text, "blocks": m.Blocks,
		}}}
	case "views.open", "views.push":
		view, _ := c.JSON["view"].(map[string]any)
		if view == nil {
			return fail("invalid_arguments")
		}
		if md, _ := view["private_metadata"].(string); len(md) > 3000 {
			return fail("invalid_arguments")
		}
		if c.Method == "views.open" && c.Field("trigger_id") == "" {
			return fail("invalid_trigger_id")
		}
		s.seq++
		view["id"] = "V" + strconv.Itoa(s.seq)
		view["hash"] = "h" + strconv.Itoa(s.seq)
		return map[string]any{"ok": true, "view": view}
	}
	return fail("unknown_method")
}

func countBlocks(raw json.RawMessage) (int, error) {
	if len(raw) == 0 {
		return 0, nil
	}
	var bs []json.RawMessage
	err := json.Unmarshal(raw, &bs)
	return len(bs), err
}

// Sign is Slack's v0 signature of body sent at ts: the value of the
// X-Slack-Signature header.
// https://api.slack.com/authentication/verifying-requests-from-slack
func Sign(secret string, ts time.Time, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%d:", ts.Unix())
	mac.Write(body)
	return "v0=" + hex.EncodeToString(mac.Sum(nil))
}

// Body is the form body Slack posts an interaction in: payload=<JSON>.
func Body(t testing.TB, cb slack.InteractionCallback) []byte {
	t.Helper()
	js, err := json.Marshal(&cb)
	if err != nil {
		t.Fatalf("slacktest: encode interaction: %v", err)
	}
	return []byte(url.Values{"payload": {string(js)}}.Encode())
}

// SignedRequest is the request Slack would send to target with body,
// signed with secret at ts.
func SignedRequest(t testing.TB, target, secret string, ts time.Time, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("slacktest: request: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set("X-Slack-Signature", Sign(secret, ts, body))
	return req
}

// BlockActions is a block_actions interaction: user clicked action on the
// message at channel and ts (its blocks as the server holds them), with a
// response_url that replaces that message.
func (s *Server) BlockActions(t testing.TB, user, channel, ts string, action slack.BlockAction) slack.InteractionCallback {
	t.Helper()
	m, ok := s.Message(channel, ts)
	if !ok {
		t.Fatalf("slacktest: no message %s/%s", channel, ts)
	}
	var msg slack.Message
	msg.Channel, msg.Timestamp, msg.Text = channel, ts, m.Text
	if err := json.Unmarshal(m.Blocks, &msg.Blocks); err != nil {
		t.Fatalf("slacktest: decode blocks: %v", err)
	}
	s.mu.Lock()
	s.seq++
	n := s.seq
	s.mu.Unlock()
	if action.ActionTs == "" {
		action.ActionTs = fmt.Sprintf("1700000002.%06d", n)
	}
	if action.BlockID == "" {
		action.BlockID = "b" + strconv.Itoa(n)
	}
	return slack.InteractionCallback{
		Type:        slack.InteractionTypeBlockActions,
		TriggerID:   "trigger-" + strconv.Itoa(n),
		ResponseURL: s.ResponseURLFor(channel, ts),
		ActionTs:    action.ActionTs,
		User:        slack.User{ID: user},
		Channel:     slack.Channel{GroupConversation: slack.GroupConversation{Conversation: slack.Conversation{ID: channel}}},
		Message:     msg,
		Container:   slack.Container{Type: "message", MessageTs: ts, ChannelID: channel},
		ActionCallback: slack.ActionCallbacks{
			BlockActions: []*slack.BlockAction{&action},
		},
	}
}

// OpenedView is the view a views.open or views.push call opened, as the
// server answered it (with its id), for ViewSubmission (which also takes
// the Call itself).
func OpenedView(c Call) any { return c.JSON["view"] }

// ViewSubmission is a view_submission of view (OpenedView of a call, or
// the view of a push acknowledgement) by user, with the input values
// values (block_id -> action_id -> value).
func ViewSubmission(t testing.TB, view any, user string, values map[string]map[string]string) slack.InteractionCallback {
	t.Helper()
	if c, ok := view.(Call); ok {
		view = OpenedView(c)
	}
	b, err := json.Marshal(view)
	if err != nil {
		t.Fatalf("slacktest: encode view: %v", err)
	}
	var v slack.View
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("slacktest: decode view: %v", err)
	}
	if v.ID == "" {
		v.ID = fmt.Sprintf("V-%x", sha256.Sum256(b))[:10]
	}
	v.Hash = fmt.Sprintf("%x", sha256.Sum256(b))[:16]
	v.State = &slack.ViewState{Values: map[string]map[string]slack.BlockAction{}}
	for block, acts := range values {
		v.State.Values[block] = map[string]slack.BlockAction{}
		for id, val := range acts {
			v.State.Values[block][id] = slack.BlockAction{ActionID: id, BlockID: block, Type: "plain_text_input", Value: val}
		}
	}
	return slack.InteractionCallback{
		Type:                   slack.InteractionTypeViewSubmission,
		User:                   slack.User{ID: user},
		View:                   v,
		ViewSubmissionCallback: slack.ViewSubmissionCallback{Hash: v.Hash},
	}
}
