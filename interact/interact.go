package interact

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
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
	ActionInspect      Action = "inspect"
	ActionHold         Action = "hold"
	ActionRelease      Action = "release"
	ActionRetryable    Action = "mark_retryable"
	ActionStoreOutcome Action = "store_outcome"
)

// Operator is one Slack user allowed to act.
type Operator struct {
	// Name is the operator's name, recorded beside the actor slack:<user id>.
	Name string
	// Actions the user may take; empty: all.
	Actions []Action
}

// Config is what a Handler needs.
type Config struct {
	Pool *pgxpool.Pool
	// Slack is the bot-token client: views.open, views.push, chat.update,
	// chat.postEphemeral.
	Slack *slack.Client
	// HTTPClient posts to response_url; nil: a default with a timeout.
	HTTPClient *http.Client
	// Operators maps a Slack user ID to the operator it is.
	Operators map[string]Operator
	// Windows is what "in flight" means per tool (as the CLI's resolve uses).
	Windows  operator.Windows
	Redactor *secret.Redactor
	Logger   *slog.Logger
	// Now is the clock for the message's context line; nil: time.Now.
	Now func() time.Time
}

// Handler handles Slack interactions on alert messages.
type Handler struct {
	cfg Config
}

var errNotYet = errors.New("interact: not implemented yet")

// New builds a Handler.
func New(cfg Config) (*Handler, error) {
	return &Handler{cfg: cfg}, nil
}

// Handle handles one interaction payload (block_actions or view_submission),
// whichever transport brought it. ack is the acknowledgement body (nil =
// empty 200; for view_submission, a response_action such as errors, push or
// clear).
func (h *Handler) Handle(ctx context.Context, cb slack.InteractionCallback) (ack any, err error) {
	return nil, errNotYet
}

// Claim records a delivery's identity in the seen-set shared by replicas
// through the database; false when already seen.
func (h *Handler) Claim(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	return false, errNotYet
}

// HTTPHandler is the /slack/interactions endpoint: it verifies Slack's
// signature over the raw body with signingSecret (slack.NewSecretsVerifier,
// 5-minute skew), refuses a replay (seen-set), parses the payload form
// field and calls Handle.
func (h *Handler) HTTPHandler(signingSecret string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not implemented", http.StatusNotImplemented)
	})
}
