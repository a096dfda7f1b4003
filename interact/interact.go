package interact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
)

// Action is one thing an operator may do from an alert message.
type Action string

// The actions, as Operators may list them.
const (
	// ActionInspect answers (to the user only) what `ledgerkeeper inspect`
	// shows.
	ActionInspect Action = "inspect"
	// ActionHold asks for a reason, then operator.Hold.
	ActionHold Action = "hold"
	// ActionRelease is operator.Release.
	ActionRelease Action = "release"
	// ActionRetryable asks for a reason, then operator.Resolve with
	// MarkRetryable.
	ActionRetryable Action = "mark_retryable"
	// ActionStoreOutcome asks for a status code, a JSON body and a reason,
	// confirms what every retry will receive, then operator.Resolve with
	// MarkCompleted.
	ActionStoreOutcome Action = "store_outcome"
)

// Actions lists every action, for configuration checks.
var Actions = []Action{ActionInspect, ActionHold, ActionRelease, ActionRetryable, ActionStoreOutcome}

// Operator is one Slack user allowed to act.
type Operator struct {
	// Name is the operator's name, recorded beside the actor slack:<user
	// id> (see the package documentation).
	Name string
	// Actions the user may take; empty: all.
	Actions []Action
}

// may reports whether o may take a.
func (o Operator) may(a Action) bool { return len(o.Actions) == 0 || slices.Contains(o.Actions, a) }

// Config is what a Handler needs.
type Config struct {
	// Pool is the ledger's database: the operator package's writes and the
	// seen-set. Required.
	Pool *pgxpool.Pool
	// Slack is the bot-token client: views.open, views.push, chat.update,
	// chat.postEphemeral, conversations.history. Required.
	Slack *slack.Client
	// HTTPClient posts to response_url; nil: a default with a
	// DefaultResponseTimeout timeout.
	HTTPClient *http.Client
	// Operators maps a Slack user ID to the operator it is; a user not in
	// it may do nothing (and the refusal is audited).
	Operators map[string]Operator
	// Windows is what "in flight" means per tool (as the CLI's resolve
	// uses: the serve configuration's window + grace and heartbeat
	// timeout). Nil: every resolve is refused, as the CLI's without a
	// configuration (Slack never forces).
	Windows operator.Windows
	// Redactor goes over every error before it is logged; nil: the
	// built-in patterns only.
	Redactor *secret.Redactor
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock of the line added to an alert ("at 13:02 UTC"); nil:
	// time.Now. Every judgement of the ledger uses the database's clock.
	Now func() time.Time
}

// DefaultResponseTimeout bounds one post to a response_url when
// Config.HTTPClient is nil.
const DefaultResponseTimeout = 5 * time.Second

// Handler handles Slack interactions on alert messages. It is safe for
// concurrent use; it starts no goroutine.
type Handler struct {
	cfg  Config
	http *http.Client
	log  *slog.Logger
	red  *secret.Redactor
	now  func() time.Time
}

// New builds a Handler, or says which required setting is missing or
// which operator lists an unknown action.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("interact: a database pool is required")
	case cfg.Slack == nil:
		return nil, errors.New("interact: a Slack client (bot token) is required")
	}
	for id, o := range cfg.Operators {
		for _, a := range o.Actions {
			if !slices.Contains(Actions, a) {
				return nil, fmt.Errorf("interact: operator %s: unknown action %q (known: inspect, hold, release, mark_retryable, store_outcome)", id, a)
			}
		}
	}
	h := &Handler{cfg: cfg, http: cfg.HTTPClient, log: cfg.Logger, red: cfg.Redactor, now: cfg.Now}
	if h.http == nil {
		h.http = &http.Client{Timeout: DefaultResponseTimeout}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	return h, nil
}

// Handle handles one interaction payload (block_actions or view_submission),
// whichever transport brought it. ack is the acknowledgement body (nil =
// empty 200; for view_submission, a response_action such as errors, push or
// clear). A payload already handled (the same click or submission
// delivered twice, by a retry, two transports or two replicas) is
// acknowledged and ignored. err is for the transport's log: what the user
// should know has been answered to them already.
func (h *Handler) Handle(ctx context.Context, cb slack.InteractionCallback) (ack any, err error) {
	switch cb.Type {
	case slack.InteractionTypeBlockActions:
		return nil, h.blockActions(ctx, cb)
	case slack.InteractionTypeViewSubmission:
		return h.viewSubmission(ctx, cb)
	}
	// view_closed, shortcuts and the like: nothing of ours.
	return nil, nil
}

// actor is the audit trail's name for a Slack user: exactly slack:<user id>.
func actor(userID string) string { return "slack:" + userID }

// byline is what goes beside the actor where the command line writes its
// reason: the operator's mapped name, so the audit row says who.
func byline(o Operator) string { return "(by " + o.Name + " via Slack)" }
