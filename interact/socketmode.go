package interact

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"

	"github.com/ledgerkeeper/ledgerkeeper/internal/backoff"
)

// Defaults of SocketModeConfig.
const (
	// DefaultSocketModeConcurrency is how many interactions one Socket Mode
	// connection handles at once.
	DefaultSocketModeConcurrency = 8
	// DefaultSocketModeSeenTTL is how long a delivery's identity stays in
	// the seen-set: longer than Slack keeps redelivering an envelope.
	DefaultSocketModeSeenTTL = 15 * time.Minute
	// DefaultSocketModeHandleTimeout bounds one interaction, its
	// acknowledgement included. Slack wants the ack within 3 seconds; the
	// bound is for a slow database, so that Stop never waits forever.
	DefaultSocketModeHandleTimeout = 15 * time.Second
	// DefaultSocketModeRetryBase and DefaultSocketModeRetryMax shape the
	// back-off after the connection failed for good (slack-go reconnects
	// by itself otherwise): a refused app token, Slack unreachable.
	DefaultSocketModeRetryBase = 5 * time.Second
	DefaultSocketModeRetryMax  = 5 * time.Minute
)

// SocketModeConfig configures the Socket Mode transport: an outbound
// WebSocket to Slack, so that no public ingress is needed. Zero values mean
// the defaults above.
type SocketModeConfig struct {
	// AppToken is the app-level token (xapp-…) with the
	// connections:write scope. Required.
	AppToken string
	// APIURL is Slack's Web API base ("" = slack.APIURL), where
	// apps.connections.open is called; it must end in "/". Tests point it
	// at internal/slacktest.
	APIURL string
	// HTTPClient calls apps.connections.open. Nil: a client with a 10s
	// timeout.
	HTTPClient *http.Client
	// Concurrency is how many interactions are handled at once.
	Concurrency int
	// SeenTTL is how long a delivery's identity is remembered by the
	// seen-set shared by replicas (Handler.Claim).
	SeenTTL time.Duration
	// HandleTimeout bounds one interaction and its acknowledgement.
	HandleTimeout time.Duration
	// RetryBase and RetryMax: back-off after slack-go gave up on the
	// connection (base·2^n, capped, ±10%).
	RetryBase, RetryMax time.Duration
	// PingInterval is how long without a WebSocket ping from Slack before
	// the connection is taken for dead and reopened. 0: slack-go's 30s.
	PingInterval time.Duration
	// Logger receives the connection's life (connected at Info, errors at
	// Warn or Error); nil discards.
	Logger *slog.Logger
}

// SocketMode receives interactions over Slack's Socket Mode and hands each
// to a Handler: deduplicated through the Handler's seen-set (so that an
// envelope redelivered to this or another replica is handled once), then
// acknowledged with Handle's answer. Reconnects within a connection's life
// are slack-go's; after slack-go gives up (a refused token), SocketMode
// starts over with back-off. Start it once; Stop is safe before Start and
// twice.
type SocketMode struct {
	h   *Handler
	cfg SocketModeConfig
	api *slack.Client
	log *slog.Logger
	// handle is h.Handle; tests count the calls.
	handle func(context.Context, slack.InteractionCallback) (any, error)

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	started bool
}

// NewSocketMode returns the Socket Mode transport for h.
func NewSocketMode(h *Handler, cfg SocketModeConfig) (*SocketMode, error) {
	if h == nil {
		return nil, errors.New("interact: socket mode needs a Handler")
	}
	if !strings.HasPrefix(cfg.AppToken, "xapp-") {
		return nil, errors.New("interact: socket mode needs an app-level token (xapp-…, scope connections:write)")
	}
	api := cmp.Or(cfg.APIURL, slack.APIURL)
	if !strings.HasSuffix(api, "/") {
		return nil, errors.New(`interact: the Slack API URL must end in "/" (slack-go appends the method name)`)
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultSocketModeConcurrency)
	cfg.SeenTTL = cmp.Or(cfg.SeenTTL, DefaultSocketModeSeenTTL)
	cfg.HandleTimeout = cmp.Or(cfg.HandleTimeout, DefaultSocketModeHandleTimeout)
	cfg.RetryBase = cmp.Or(cfg.RetryBase, DefaultSocketModeRetryBase)
	cfg.RetryMax = cmp.Or(cfg.RetryMax, DefaultSocketModeRetryMax)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The app-level token opens connections; the bot token (h's client)
	// does everything else.
	client := slack.New("", slack.OptionAppLevelToken(cfg.AppToken), slack.OptionAPIURL(api), slack.OptionHTTPClient(cfg.HTTPClient))
	return &SocketMode{h: h, cfg: cfg, api: client, log: log.With("transport", "socket_mode"), handle: h.Handle}, nil
}

// Start connects in the background and returns at once; connection
// problems are logged and retried, never returned. It runs until ctx is
// cancelled or Stop is called.
func (s *SocketMode) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("interact: socket mode already started")
	}
	s.started = true
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		s.run(ctx)
	}()
	return nil
}

// Stop closes the connection and waits for the interactions in hand to
// finish (each bounded by HandleTimeout), as a cancelled ctx does. Envelopes received but not yet
// handled are not acknowledged: Slack redelivers them, to another replica
// if one is connected.
func (s *SocketMode) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// run keeps one slack-go client running until ctx ends, starting over with
// back-off when slack-go gives up.
func (s *SocketMode) run(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := backoff.Delay(s.cfg.RetryBase, s.cfg.RetryMax, attempt, backoff.Jitter(0.9, 1.1))
		s.log.Error("slack socket mode connection failed: interactions from Slack are not received until it reconnects; check alerts.slack.app_token (an app-level token with connections:write, Socket Mode enabled in the app)",
			"err", s.redact(err), "retry_in", wait.Round(time.Second))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// runOnce runs one slack-go client (which reconnects by itself) and the
// loop that consumes its events, until ctx ends or the client gives up.
func (s *SocketMode) runOnce(ctx context.Context) error {
	client := socketmode.New(s.api, s.options()...)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.consume(ctx, client) })
	err := client.RunContext(ctx) //nolint:staticcheck // SA4023: see the nil check below
	cancel()
	wg.Wait()
	if err == nil { //nolint:staticcheck // SA4023: slack-go's RunContext never returns nil today; runOnce must not return nil if that changes
		err = errors.New("socket mode client stopped")
	}
	return err
}

func (s *SocketMode) options() []socketmode.Option {
	opts := []socketmode.Option{socketmode.OptionLog(discardLog{})}
	if s.cfg.PingInterval > 0 {
		opts = append(opts, socketmode.OptionPingInterval(s.cfg.PingInterval))
	}
	return opts
}

// consume reads the client's events until ctx ends; interactions are
// handled on goroutines of their own (at most Concurrency at once), which
// it waits for before it returns.
func (s *SocketMode) consume(ctx context.Context, client *socketmode.Client) {
	slots := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		var evt socketmode.Event
		select {
		case <-ctx.Done():
			return
		case evt = <-client.Events:
		}
		switch evt.Type {
		case socketmode.EventTypeConnected:
			n := 0
			if c, ok := evt.Data.(*socketmode.ConnectedEvent); ok {
				n = c.ConnectionCount
			}
			s.log.Info("slack socket mode connected: receiving interactions", "connection", n+1)
		case socketmode.EventTypeConnectionError:
			var err error
			if c, ok := evt.Data.(*slack.ConnectionErrorEvent); ok {
				err = c.ErrorObj
			}
			s.log.Warn("slack socket mode cannot connect; retrying", "err", s.redact(err))
		case socketmode.EventTypeInvalidAuth:
			s.log.Error("slack refused the app-level token (alerts.slack.app_token)")
		case socketmode.EventTypeIncomingError, socketmode.EventTypeErrorBadMessage, socketmode.EventTypeErrorWriteFailed:
			s.log.Warn("slack socket mode message problem", "event", string(evt.Type))
		case socketmode.EventTypeInteractive:
			cb, ok := evt.Data.(slack.InteractionCallback)
			if !ok || evt.Request == nil {
				continue
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return // not acknowledged: Slack redelivers it
			}
			req := *evt.Request
			wg.Go(func() {
				defer func() { <-slots }()
				s.interaction(ctx, client, req, cb)
			})
		case socketmode.EventTypeEventsAPI, socketmode.EventTypeSlashCommand:
			// Not ours (the app may subscribe to more): acknowledged, so
			// that Slack does not redeliver it.
			if evt.Request != nil {
				_ = client.AckCtx(ctx, evt.Request.EnvelopeID, nil)
			}
		default:
			s.log.Debug("slack socket mode event", "event", string(evt.Type))
		}
	}
}

// interaction handles one interactive envelope once across replicas: both
// the envelope's ID and the interaction's own identity must be new to the
// seen-set; a duplicate is acknowledged and dropped. A stop in the middle
// lets the interaction finish (bounded by HandleTimeout): an operator's
// write is not cut short.
func (s *SocketMode) interaction(ctx context.Context, client *socketmode.Client, req socketmode.Request, cb slack.InteractionCallback) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.HandleTimeout)
	defer cancel()
	for _, id := range deliveryIDs(req, cb) {
		fresh, err := s.h.Claim(hctx, id, s.cfg.SeenTTL)
		if err != nil {
			// Unknown whether another replica has it: not handled, not
			// acknowledged (the operator sees Slack's error and can click
			// again).
			s.log.Error("slack interaction not handled: the seen-set cannot be reached", "err", s.redact(err), "user", cb.User.ID)
			return
		}
		if !fresh {
			s.log.Debug("slack interaction already handled (redelivery)", "envelope_id", req.EnvelopeID, "user", cb.User.ID)
			s.ack(hctx, client, req, nil)
			return
		}
	}
	ack, err := s.handle(hctx, cb)
	if err != nil {
		s.log.Error("slack interaction failed", "err", s.redact(err), "user", cb.User.ID, "type", string(cb.Type))
	}
	// Acknowledged even after an error: the delivery was taken (the
	// seen-set has it), and a redelivery would only be dropped.
	s.ack(hctx, client, req, ack)
}

func (s *SocketMode) ack(ctx context.Context, client *socketmode.Client, req socketmode.Request, payload any) {
	if err := client.AckCtx(ctx, req.EnvelopeID, payload); err != nil {
		s.log.Warn("slack socket mode acknowledgement not sent", "err", s.redact(err), "envelope_id", req.EnvelopeID)
	}
}

// deliveryIDs are the identities one interactive envelope is known by in
// the seen-set: its envelope ID (Slack's redelivery of one envelope) and
// the interaction's own identity (the same click in another envelope):
// who, what, and Slack's trigger and action timestamps, which differ for
// every click, and a form's values, which differ between a submission
// sent back with errors and the corrected one.
func deliveryIDs(req socketmode.Request, cb slack.InteractionCallback) []string {
	var ids []string
	if req.EnvelopeID != "" {
		ids = append(ids, "socket_mode:envelope:"+req.EnvelopeID)
	}
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field(string(cb.Type))
	field(cb.Team.ID)
	field(cb.User.ID)
	field(cb.TriggerID)
	field(cb.ActionTs)
	for _, a := range cb.ActionCallback.BlockActions {
		field(a.BlockID)
		field(a.ActionID)
		field(a.ActionTs)
		field(a.Value)
	}
	field(cb.View.ID)
	field(cb.View.Hash)
	if cb.View.State != nil {
		// A form sent back with errors keeps its id and hash: what was
		// typed tells its second submission from a redelivery of the first.
		state, _ := json.Marshal(cb.View.State.Values) // maps: sorted keys, the same bytes for the same values
		field(string(state))
	}
	field(cb.Container.MessageTs)
	if cb.TriggerID == "" && cb.ActionTs == "" && len(cb.ActionCallback.BlockActions) == 0 && cb.View.ID == "" {
		// Nothing that tells two clicks apart: the raw payload does.
		_, _ = h.Write(req.Payload)
	}
	return append(ids, "interaction:"+hex.EncodeToString(h.Sum(nil)[:16]))
}

func (s *SocketMode) redact(err error) string {
	if err == nil {
		return ""
	}
	if s.h.cfg.Redactor != nil {
		return s.h.cfg.Redactor.String(err.Error())
	}
	return err.Error()
}

// discardLog silences slack-go's own logger (it writes only in debug mode,
// which is never on: its payload logs carry user data).
type discardLog struct{}

func (discardLog) Output(int, string) error { return nil }
