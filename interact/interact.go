package interact

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/operator"
	"github.com/ledgerkeeper/ledgerkeeper/store"
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
	// seen-set. Required without Ledgers; with Ledgers it holds the
	// seen-set only (nil: the pool of the first ledger by name).
	Pool store.Pool
	// Ledgers, when set, are the ledgers of a process that keeps several,
	// by name (each one's alerts.Config.Ledger): every control's value
	// then names its ledger (alerts.ControlValue), and an action acts on
	// that ledger's Pool with its Windows, and on no other. A value naming
	// a ledger not in Ledgers, or naming none, changes nothing: the user
	// is told and the attempt is logged. Pool (but for the seen-set) and
	// Windows are then unused.
	Ledgers map[string]Ledger
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

	// DecideTimeout bounds the database work an interaction does before it
	// is acknowledged (the seen-set, the operator package's transaction);
	// 0: DefaultDecideTimeout. It is not cancelled when Slack hangs up.
	DecideTimeout time.Duration
	// FollowUpTimeout bounds one attempt of a follow-up (an answer, the
	// alert's update, a form); 0: DefaultFollowUpTimeout. A form must open
	// within TriggerTTL of the interaction whatever this says.
	FollowUpTimeout time.Duration
	// FollowUpAttempts is how many times a follow-up that failed for a
	// reason that may pass (Slack's 5xx, 429, the network) is tried; 0:
	// DefaultFollowUpAttempts; 1: no retry.
	FollowUpAttempts int
	// FollowUpBackoffBase and FollowUpBackoffMax shape the waits between
	// attempts (base·2^n capped at max, ±10%; a 429's Retry-After,
	// capped at max); 0: the defaults.
	FollowUpBackoffBase, FollowUpBackoffMax time.Duration
	// StopGrace is how long Stop lets the follow-ups in hand finish before
	// it cancels them; 0: DefaultStopGrace.
	StopGrace time.Duration
}

// Ledger is one of several ledgers a Handler acts on (Config.Ledgers).
type Ledger struct {
	// Pool is the ledger's database, its statements qualified with the
	// ledger's schema (ledger.InSchema). Required.
	Pool store.Pool
	// Windows is what "in flight" means per tool of this ledger (its
	// engine's); nil: every resolve is refused.
	Windows operator.Windows
}

// book is the ledger an action acts on: its name ("" for the one ledger of
// a Handler without Config.Ledgers), its database and its windows.
type book struct {
	name    string
	pool    store.Pool
	windows operator.Windows
}

// DefaultResponseTimeout bounds one post to a response_url when
// Config.HTTPClient is nil.
const DefaultResponseTimeout = 5 * time.Second

// Handler handles Slack interactions on alert messages. It is safe for
// concurrent use. What it tells Slack after an interaction (answers, the
// alert's update, forms) runs on goroutines it owns, after the
// acknowledgement; Stop waits for them (see the package documentation).
type Handler struct {
	cfg  Config
	http *http.Client
	log  *slog.Logger
	red  *secret.Redactor
	now  func() time.Time
	fu   followUps
	msgs msgLocks // one update at a time per alert message
	// seen holds the seen-set: Config.Pool, or the first ledger's.
	seen store.Pool
}

// New builds a Handler, or says which required setting is missing or
// which operator lists an unknown action.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Pool == nil && len(cfg.Ledgers) == 0:
		return nil, errors.New("interact: a database pool is required")
	case cfg.Slack == nil:
		return nil, errors.New("interact: a Slack client (bot token) is required")
	}
	seen := cfg.Pool
	for _, name := range slices.Sorted(maps.Keys(cfg.Ledgers)) {
		if err := alerts.CheckLedgerName(name); err != nil {
			return nil, fmt.Errorf("interact: %w", err)
		}
		if cfg.Ledgers[name].Pool == nil {
			return nil, fmt.Errorf("interact: ledger %s: a database pool is required", name)
		}
		if seen == nil {
			seen = cfg.Ledgers[name].Pool
		}
	}
	for id, o := range cfg.Operators {
		for _, a := range o.Actions {
			if !slices.Contains(Actions, a) {
				return nil, fmt.Errorf("interact: operator %s: unknown action %q (known: inspect, hold, release, mark_retryable, store_outcome)", id, a)
			}
		}
	}
	cfg.DecideTimeout = cmp.Or(cfg.DecideTimeout, DefaultDecideTimeout)
	cfg.FollowUpTimeout = cmp.Or(cfg.FollowUpTimeout, DefaultFollowUpTimeout)
	cfg.FollowUpAttempts = cmp.Or(cfg.FollowUpAttempts, DefaultFollowUpAttempts)
	cfg.FollowUpBackoffBase = cmp.Or(cfg.FollowUpBackoffBase, DefaultFollowUpBackoffBase)
	cfg.FollowUpBackoffMax = cmp.Or(cfg.FollowUpBackoffMax, DefaultFollowUpBackoffMax)
	cfg.StopGrace = cmp.Or(cfg.StopGrace, DefaultStopGrace)
	h := &Handler{cfg: cfg, http: cfg.HTTPClient, log: cfg.Logger, red: cfg.Redactor, now: cfg.Now, seen: seen}
	h.fu.ctx, h.fu.cancel = context.WithCancel(context.Background())
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
// should know is answered to them (after the acknowledgement); ErrStopped
// after Stop, when nothing was done.
//
// Handle returns once the interaction is decided and recorded in the
// database (the seen-set, authorization and its audit, the operator
// action); it never waits on Slack: answers, the alert's update and a
// form (views.open, started at once, within TriggerTTL) are follow-ups
// that run after it returns.
func (h *Handler) Handle(ctx context.Context, cb slack.InteractionCallback) (ack any, err error) {
	if !h.fu.enter() {
		return nil, ErrStopped
	}
	defer h.fu.leave()
	received := receivedAt(ctx)
	// The decision is ours to finish once taken: not cut short when Slack
	// hangs up the request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.DecideTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, receivedKey{}, received)
	switch cb.Type {
	case slack.InteractionTypeBlockActions:
		return nil, h.blockActions(ctx, cb)
	case slack.InteractionTypeViewSubmission:
		return h.viewSubmission(ctx, cb)
	}
	// view_closed, shortcuts and the like: nothing of ours.
	return nil, nil
}

type receivedKey struct{}

// withReceived records in ctx when a transport received an interaction,
// so that a form opens within TriggerTTL of that moment; Handle takes
// time.Now without it.
func withReceived(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, receivedKey{}, at)
}

func receivedAt(ctx context.Context) time.Time {
	if at, ok := ctx.Value(receivedKey{}).(time.Time); ok {
		return at
	}
	return time.Now()
}

// fleet reports whether the Handler serves several ledgers
// (Config.Ledgers): control values then name their ledger.
func (h *Handler) fleet() bool { return len(h.cfg.Ledgers) > 0 }

// bookNamed is the ledger called name: "" is the one ledger of a Handler
// without Config.Ledgers; with them, name must be one of them.
func (h *Handler) bookNamed(name string) (book, bool) {
	if !h.fleet() {
		return book{pool: h.cfg.Pool, windows: h.cfg.Windows}, name == ""
	}
	l, ok := h.cfg.Ledgers[name]
	if !ok {
		return book{}, false
	}
	return book{name: name, pool: l.Pool, windows: l.Windows}, true
}

// route reads a control's value: the key itself for a Handler without
// Config.Ledgers (as every value always was), else the ledger's name and
// the key (alerts.ParseLedgerValue) of a ledger in Config.Ledgers. When it
// cannot say which ledger, why is the answer to the user.
func (h *Handler) route(value string) (b book, key, why string) {
	if !h.fleet() {
		return book{pool: h.cfg.Pool, windows: h.cfg.Windows}, value, ""
	}
	name, key, ok := alerts.ParseLedgerValue(value)
	if !ok {
		return book{}, "", "That control names no ledger, and this ledgerkeeper keeps several (" + h.ledgerList() +
			"), so it cannot tell which one to act on: nothing changed. Use the command line with `--ledger NAME`."
	}
	b, ok = h.bookNamed(name)
	if !ok {
		return book{}, "", "That control names ledger " + alerts.InlineCode(name, 70) + ", which this ledgerkeeper does not keep (it keeps " +
			h.ledgerList() + "): nothing changed."
	}
	return b, key, ""
}

// ledgerList names the ledgers of Config.Ledgers, sorted, for a text.
func (h *Handler) ledgerList() string {
	names := slices.Sorted(maps.Keys(h.cfg.Ledgers))
	for i, n := range names {
		names[i] = alerts.InlineCode(n, 70)
	}
	return strings.Join(names, ", ")
}

// actor is the audit trail's name for a Slack user: exactly slack:<user
// id>, and " (ledger NAME)" after it when the Handler serves several
// ledgers, so that an audit row read on its own says where the act was
// taken.
func (b book) actor(userID string) string {
	if b.name == "" {
		return "slack:" + userID
	}
	return "slack:" + userID + " (ledger " + b.name + ")"
}

// byline is what goes beside the actor where the command line writes its
// reason: the operator's mapped name, so the audit row says who.
func byline(o Operator) string { return "(by " + o.Name + " via Slack)" }
