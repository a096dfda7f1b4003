package interact

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/slack-go/slack"
)

// maxBody bounds an interaction request: a payload carries the whole
// message it came from (up to 50 blocks of 3000 characters).
const maxBody = 1 << 20

// HTTPHandler is the /slack/interactions endpoint: it verifies Slack's
// signature over the raw body with signingSecret (slack.NewSecretsVerifier:
// HMAC-SHA256, timestamps more than 5 minutes off refused), refuses a
// replayed request (its signature is remembered in the seen-set), parses
// the payload form field and calls Handle, whose answer is the response:
// the acknowledgement, sent as soon as the interaction is decided in the
// database, never after a Slack call (Handle's follow-ups run after it).
// Refusals answer 401 (bad or stale signature), 409 (replay), 400 (no
// payload), 405 and 413, each before anything is read from or written to
// the ledger, and 503 once Stop was called (nothing done). The secret is
// never logged nor answered.
// https://api.slack.com/authentication/verifying-requests-from-slack
func (h *Handler) HTTPHandler(signingSecret string) http.Handler {
	h.red.Register(signingSecret)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received := time.Now()
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				http.Error(w, "request too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "cannot read the request", http.StatusBadRequest)
			return
		}
		sv, err := slack.NewSecretsVerifier(r.Header, signingSecret)
		if err == nil {
			_, _ = sv.Write(body)
			err = sv.Ensure()
		}
		if err != nil {
			why := "invalid signature"
			if errors.Is(err, slack.ErrExpiredTimestamp) {
				why = "stale timestamp (more than 5 minutes off)"
			}
			h.log.Warn("slack interaction refused", "why", why, "remote", r.RemoteAddr)
			http.Error(w, why, http.StatusUnauthorized)
			return
		}
		if !h.fu.accepting() {
			// Shutting down: nothing taken, so that Slack's user clicks
			// again (on a replica still running).
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		// The signature covers timestamp and body: the same one twice is
		// the same request replayed.
		fresh, err := h.Claim(r.Context(), "req:"+r.Header.Get("X-Slack-Request-Timestamp")+":"+r.Header.Get("X-Slack-Signature"), SeenTTL)
		if err != nil {
			h.log.Error("slack interaction: seen-set", "err", h.red.Error(err))
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		if !fresh {
			h.log.Warn("slack interaction refused", "why", "replayed request", "remote", r.RemoteAddr)
			http.Error(w, "replayed request", http.StatusConflict)
			return
		}
		form, err := url.ParseQuery(string(body))
		payload := form.Get("payload")
		if err != nil || payload == "" {
			http.Error(w, "no payload", http.StatusBadRequest)
			return
		}
		var cb slack.InteractionCallback
		if err := json.Unmarshal([]byte(payload), &cb); err != nil {
			http.Error(w, "payload is not an interaction", http.StatusBadRequest)
			return
		}
		ack, err := h.Handle(withReceived(r.Context(), received), cb)
		if errors.Is(err, ErrStopped) {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		if err != nil {
			h.log.Error("slack interaction failed", "type", string(cb.Type), "user", cb.User.ID, "err", h.red.Error(err))
		}
		if ack == nil {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ack)
	})
}
