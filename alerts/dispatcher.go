package alerts

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/backoff"
	"github.com/ledgerkeeper/ledgerkeeper/internal/lease"
	"github.com/ledgerkeeper/ledgerkeeper/internal/safetext"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// Defaults of Config, used where a field is zero.
const (
	DefaultBatchSize         = 1000
	DefaultLease             = 2 * time.Minute
	DefaultNotifyTimeout     = 30 * time.Second
	DefaultBackoffBase       = 15 * time.Second
	DefaultBackoffMax        = 10 * time.Minute
	DefaultPermanentBackoff  = 15 * time.Minute
	DefaultPermanentRetry    = time.Minute
	DefaultMaxKeysPerMessage = 20
)

const (
	// dbTimeout bounds each statement of the dispatcher.
	dbTimeout = 15 * time.Second
	// leaseMargin is kept between the last post of a pass and the end of
	// its lease, so no other dispatcher can claim a row being posted.
	leaseMargin = 5 * time.Second
	// maxStoredError bounds alert_outbox.last_error.
	maxStoredError = 500
)

// Config tunes a Dispatcher. Zero values mean the documented default.
type Config struct {
	// Owner names this dispatcher in lease_owner (each pass adds a nonce).
	// Default: hostname-pid.
	Owner string
	// BatchSize is the most outbox rows one pass claims. All the rows of
	// one kind and reason go into one message whatever their number (the
	// message lists MaxKeysPerMessage and counts the rest), so a pass posts
	// at most one message per kind and reason, and one per unreachable
	// Citus worker (shards_unreachable). Default 1000.
	BatchSize int
	// Lease is how long claimed rows are reserved for this pass; a crashed
	// dispatcher's rows are due again once it ends. It must exceed
	// NotifyTimeout by more than 5s: no post starts unless it can finish
	// inside the lease. Default 2m.
	Lease time.Duration
	// NotifyTimeout bounds one Notify call. Default 30s.
	NotifyTimeout time.Duration
	// BackoffBase and BackoffMax shape the retry of a failed message:
	// BackoffBase·2^attempts capped at BackoffMax, with equal jitter, never
	// sooner than a 429's Retry-After. Defaults 15s and 10m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// PermanentRetry and PermanentBackoff shape the retry after a
	// permanent error (bad token, missing channel, removed webhook):
	// PermanentRetry·2^attempts capped at PermanentBackoff, without jitter
	// (1m, 2m, 4m, 8m, then every 15m by default), so a running serve
	// picks up a fix on the Slack side by itself. Such rows are also
	// retried at the first pass of each new Dispatcher, so a fixed
	// configuration takes effect at the next restart or CLI run at once.
	// Defaults 1m and 15m.
	PermanentRetry   time.Duration
	PermanentBackoff time.Duration
	// MaxKeysPerMessage bounds the keys listed in one message; the rest are
	// counted. Capped at 47 by Slack's 50 blocks. Default 20.
	MaxKeysPerMessage int
	// RunbookURL is the base link of runbook.md; sections are appended as
	// #<reason>. Empty (or not a plain http(s) URL): messages name the
	// section as text.
	RunbookURL string
	// ConsoleURL is where the web console is reached
	// (console.public_url): each key listed links to its page there.
	// Empty (or not a plain http(s) URL): no link.
	ConsoleURL string
	// Now is the clock for due times, leases and back-off. Nil: the
	// database's now(), one clock for every replica. Tests pin it.
	Now func() time.Time
	// Redactor removes the configuration's secrets from every text a
	// message carries (probe errors, notes, keys) and from stored
	// delivery errors. Nil: only what looks like a credential (URL
	// passwords, DSN passwords, bearer and Slack tokens, webhook paths).
	Redactor *secret.Redactor
	// Interactive draws action buttons on firing messages (Inspect, Hold
	// or Release, Mark retryable, Store outcome; package interact handles
	// them). Off by default: without a configured interactivity transport
	// the buttons would lead nowhere.
	Interactive bool
	// Held says which of keys are on hold now, so that a one-key message
	// offers Release for a held key and Hold for the others (the daemon
	// wires store.HeldKeys: the alert tables are ours, key_holds is not).
	// Nil: no key is taken as held. An error draws Hold, logged.
	Held func(ctx context.Context, keys []string) (map[string]bool, error)
	// Ledger is the name of the ledger this dispatcher delivers for, in a
	// process that keeps several (the configuration's ledgers section),
	// all posting to one Slack channel: every message names it (its
	// header ends "· ledger NAME", its notification text starts "Ledger
	// NAME:", its commands carry --ledger NAME), and every control's value
	// carries it (ControlValue), so that interact acts on this ledger's
	// database only. It must pass CheckLedgerName. "": the one ledger of a
	// process that keeps one; messages and values are as they always were.
	Ledger string
}

// markHeld sets the hold state of a firing one-key message's key, the one
// message that carries a Hold or Release button.
func (d *Dispatcher) markHeld(ctx context.Context, g group) {
	if !d.cfg.Interactive || d.cfg.Held == nil || g.kind != KindFiring || len(g.items) != 1 || g.items[0].key == "" {
		return
	}
	held, err := d.cfg.Held(ctx, []string{g.items[0].key})
	if err != nil {
		d.logger.Warn("read the alerted key's hold; its message offers Hold", "err", err)
		return
	}
	g.items[0].held = held[g.items[0].key]
}

func (c Config) withDefaults() Config {
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d", cmp.Or(host, "ledgerkeeper"), os.Getpid())
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.NotifyTimeout = cmp.Or(c.NotifyTimeout, DefaultNotifyTimeout)
	c.BackoffBase = cmp.Or(c.BackoffBase, DefaultBackoffBase)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.PermanentBackoff = cmp.Or(c.PermanentBackoff, DefaultPermanentBackoff)
	c.PermanentRetry = cmp.Or(c.PermanentRetry, min(DefaultPermanentRetry, c.PermanentBackoff))
	c.MaxKeysPerMessage = cmp.Or(c.MaxKeysPerMessage, DefaultMaxKeysPerMessage)
	return c
}

// mustValidate panics on settings no operator can give (they are not in
// the configuration file): a programming error.
func (c Config) mustValidate() {
	switch {
	case c.BatchSize < 0, c.Lease < 0, c.NotifyTimeout < 0, c.BackoffBase < 0,
		c.BackoffMax < 0, c.PermanentBackoff < 0, c.PermanentRetry < 0, c.MaxKeysPerMessage < 0:
		panic("alerts: negative Config value")
	case c.Lease <= c.NotifyTimeout+leaseMargin:
		panic(fmt.Sprintf("alerts: Lease (%s) must exceed NotifyTimeout (%s) by more than %s", c.Lease, c.NotifyTimeout, leaseMargin))
	case c.BackoffMax < c.BackoffBase:
		panic("alerts: BackoffMax shorter than BackoffBase")
	case c.PermanentBackoff < c.PermanentRetry:
		panic("alerts: PermanentBackoff shorter than PermanentRetry")
	case c.Ledger != "" && CheckLedgerName(c.Ledger) != nil:
		panic("alerts: " + CheckLedgerName(c.Ledger).Error())
	}
}

// Dispatcher delivers the outbox: each RunOnce claims due rows with a
// lease, posts one message per kind and reason, and marks the rows sent or
// schedules their retry. It starts no goroutine; the daemon calls RunOnce
// on its schedule and the CLI at the end of a pass. Concurrent RunOnce
// calls on one Dispatcher run one after the other; any number of
// Dispatchers (replicas) may run at once. See doc.go.
type Dispatcher struct {
	pool     DBTX
	cfg      Config
	notifier Notifier
	logger   *slog.Logger
	metrics  *Metrics
	render   renderer

	sem    chan struct{}
	passes atomic.Int64
	// retriedPermanent: the first pass already pulled forward the rows a
	// permanent error had pushed back.
	retriedPermanent atomic.Bool
}

// New returns a Dispatcher. pool must be a pool, not a transaction: a
// claim commits before anything is posted. logger and metrics may be nil.
func New(pool DBTX, cfg Config, notifier Notifier, logger *slog.Logger, metrics *Metrics) *Dispatcher {
	if pool == nil || notifier == nil {
		panic("alerts: New needs a pool and a notifier")
	}
	cfg = cfg.withDefaults()
	cfg.mustValidate()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{
		pool:     pool,
		cfg:      cfg,
		notifier: notifier,
		logger:   logger,
		metrics:  metrics,
		render:   newRenderer(cfg.RunbookURL, cfg.MaxKeysPerMessage).withRedactor(cfg.Redactor).withInteractive(cfg.Interactive).withConsole(cfg.ConsoleURL).withLedger(cfg.Ledger),
		sem:      make(chan struct{}, 1),
	}
}

// Report is what one pass did, for logs, `ledgerkeeper_runs` and the CLI.
type Report struct {
	// Claimed is the number of outbox rows the pass leased.
	Claimed int `json:"claimed"`
	// Messages and Delivered count the messages posted and the alerts
	// they carried.
	Messages  int `json:"messages"`
	Delivered int `json:"delivered"`
	// FailedMessages and Failed count messages Slack did not take and
	// their alerts; they stay pending with a later next_attempt_at.
	FailedMessages int `json:"failed_messages"`
	Failed         int `json:"failed"`
	// Deferred counts alerts not tried in this pass (after a failure that
	// would fail them too, at shutdown, or when the lease ran short).
	Deferred int `json:"deferred"`
	// Permanent: Slack refused with an error that needs a human.
	Permanent bool `json:"permanent,omitempty"`
	// LastError is the last delivery error of the pass, redacted.
	LastError string `json:"last_error,omitempty"`
	// LeaseLost counts alerts posted whose lease another dispatcher had
	// taken over meanwhile: they may be posted twice.
	LeaseLost int `json:"lease_lost,omitempty"`
	// Pending is the outbox's pending rows after the pass.
	Pending int `json:"pending"`
	// RateLimitedUntil is set when the pass posted nothing because Slack's
	// Retry-After from an earlier 429 has not passed yet.
	RateLimitedUntil *time.Time `json:"rate_limited_until,omitempty"`
}

// group is the items of one kind and reason (and worker, for alerts
// about a Citus worker): one message.
type group struct {
	kind   Kind
	reason Reason
	// node is the Citus worker the group is about, "" for keys and tools.
	node  string
	items []item
}

// ids are the outbox rows the group's message settles: its items and the
// notices they superseded (see collapse).
func (g group) ids() []int64 {
	ids := make([]int64, 0, len(g.items))
	for _, it := range g.items {
		ids = append(ids, it.id)
		ids = append(ids, it.supersedes...)
	}
	return ids
}

func (g group) maxAttempts() int {
	n := 0
	for _, it := range g.items {
		n = max(n, it.attempts)
	}
	return n
}

// failure is one failed message, for the pass's log line.
type failure struct {
	class FailureClass
	err   string
	delay time.Duration
}

// RunOnce runs one pass. Delivery failures are not errors: the alerts stay
// pending and the Report says what happened. The error reports a pass that
// could not work (the database), or ctx ending before the claim.
func (d *Dispatcher) RunOnce(ctx context.Context) (Report, error) {
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return Report{}, ctx.Err()
	}
	defer func() { <-d.sem }()

	var rep Report
	started := time.Now()
	if !d.retriedPermanent.Load() {
		if err := d.retryPermanentNow(ctx); err != nil {
			return rep, err
		}
		d.retriedPermanent.Store(true)
	}
	// A 429 holds back every post to this webhook or channel until its
	// Retry-After, not only the rows it refused: an alert raised meanwhile
	// waits too (replicas share the outbox, so they all see it).
	if until, err := d.rateLimitedUntil(ctx); err != nil {
		return rep, err
	} else if until != nil {
		rep.RateLimitedUntil = until
		if h, err := Health(ctx, d.pool); err == nil {
			rep.Pending = h.Pending
			d.metrics.pending(h)
		}
		return rep, nil
	}
	token := d.leaseToken()
	passNow, items, err := d.claim(ctx, token)
	if err != nil {
		return rep, err
	}
	rep.Claimed = len(items)
	items = collapse(items)
	// Only posts that can finish inside the lease start.
	deadline := started.Add(d.cfg.Lease - leaseMargin)

	var errs []error
	failures := map[FailureClass][]failure{}
	var stop *failure // set when the rest of the pass would fail the same way
	for _, g := range groupItems(items) {
		switch {
		case stop != nil:
			rep.Deferred += len(g.items)
			errs = append(errs, d.deferGroup(ctx, g, token, *stop))
			continue
		case ctx.Err() != nil || time.Until(deadline) < d.cfg.NotifyTimeout:
			rep.Deferred += len(g.items)
			errs = append(errs, d.release(ctx, g, token))
			continue
		}
		d.markHeld(ctx, g)
		msg := d.render.render(g.kind, g.reason, g.items, passNow)
		nctx, cancel := context.WithTimeout(ctx, d.cfg.NotifyTimeout)
		retry, nerr := d.notifier.Notify(nctx, msg)
		cancel()
		if nerr == nil {
			n, err := d.markSent(ctx, g, token)
			errs = append(errs, err)
			rep.Messages++
			rep.Delivered += len(g.items)
			if ids := len(g.ids()); err == nil && n < ids {
				rep.LeaseLost += ids - n
				d.logger.Warn("alert message posted after its lease was taken over: another dispatcher may post it again; raise the lease",
					"reason", string(g.reason), "kind", string(g.kind), "alerts", ids-n)
			}
			d.metrics.sent(g.kind, g.reason, len(g.items))
			continue
		}
		if ctx.Err() != nil {
			// Shutting down mid-post: it may or may not have landed. The
			// rows are due again at once (a repeat is the only risk).
			rep.Deferred += len(g.items)
			errs = append(errs, d.release(ctx, g, token))
			continue
		}
		class, retryAfter, perMessage := classify(retry, nerr)
		// Notifiers redact their errors; the configuration's redactor
		// goes over them again before they are stored and logged.
		f := failure{class: class, err: safetext.ClipRunes(d.cfg.Redactor.String(nerr.Error()), maxStoredError), delay: d.delay(class, g.maxAttempts(), retryAfter)}
		errs = append(errs, d.markFailed(ctx, g, token, f))
		rep.FailedMessages++
		rep.Failed += len(g.items)
		rep.LastError = f.err
		rep.Permanent = rep.Permanent || class == ClassPermanent
		failures[class] = append(failures[class], f)
		d.metrics.failed(class)
		if !perMessage {
			stop = &f
		}
	}
	d.logFailures(failures, rep)

	if h, err := Health(ctx, d.pool); err == nil {
		rep.Pending = h.Pending
		d.metrics.pending(h)
	} else if ctx.Err() == nil {
		errs = append(errs, err)
	}
	if rep.Messages > 0 {
		d.logger.Info("alerts delivered", "messages", rep.Messages, "alerts", rep.Delivered, "pending", rep.Pending)
	}
	return rep, errors.Join(errs...)
}

// logFailures logs once per class per pass, however many messages failed.
func (d *Dispatcher) logFailures(failures map[FailureClass][]failure, rep Report) {
	for _, class := range []FailureClass{ClassPermanent, ClassRateLimited, ClassRetryable} {
		fs := failures[class]
		if len(fs) == 0 {
			continue
		}
		last := fs[len(fs)-1]
		attrs := []any{"class", string(class), "messages", len(fs), "retry_in", last.delay.Round(time.Second),
			"deferred", rep.Deferred, "err", last.err}
		switch class {
		case ClassPermanent:
			d.logger.Error("Slack refuses alerts: they stay in the outbox until the Slack configuration is fixed (see runbook.md#slack-delivery)", attrs...)
		case ClassRateLimited:
			d.logger.Warn("Slack rate-limited alerts: they stay in the outbox until Retry-After", attrs...)
		default:
			d.logger.Warn("could not deliver alerts to Slack: they stay in the outbox and will be retried", attrs...)
		}
	}
}

// leaseToken is unique per pass, so marking a row is conditional on this
// very claim: a pass whose lease was taken over marks nothing.
func (d *Dispatcher) leaseToken() string {
	return lease.Token(fmt.Sprintf("%s/%d", d.cfg.Owner, d.passes.Add(1)))
}

// now is the pinned clock's time, or nil for the database's now().
func (d *Dispatcher) now() *time.Time {
	if d.cfg.Now == nil {
		return nil
	}
	t := d.cfg.Now()
	return &t
}

// delay is how long a failed message waits: exponential back-off with
// equal jitter (half fixed, half random, so replicas and rows spread out),
// never sooner than the server's Retry-After.
func (d *Dispatcher) delay(class FailureClass, attempts int, retryAfter time.Duration) time.Duration {
	if class == ClassPermanent {
		return max(backoff.Delay(d.cfg.PermanentRetry, d.cfg.PermanentBackoff, attempts, 1), retryAfter)
	}
	return max(backoff.Delay(d.cfg.BackoffBase, d.cfg.BackoffMax, attempts, backoff.Jitter(0.5, 1)), retryAfter)
}

const sqlRateLimitedUntil = `SELECT max(next_attempt_at) FROM alert_outbox
	WHERE status = 'pending' AND last_error_class = 'rate_limited'
	  AND next_attempt_at > coalesce($1::timestamptz, now())`

// rateLimitedUntil is the end of a Retry-After still running, or nil.
func (d *Dispatcher) rateLimitedUntil(ctx context.Context) (*time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	var until *time.Time
	if err := d.pool.QueryRow(ctx, sqlRateLimitedUntil, d.now()).Scan(&until); err != nil {
		return nil, fmt.Errorf("read Slack's rate limit from the outbox: %w", err)
	}
	return until, nil
}

const sqlRetryPermanent = `UPDATE alert_outbox SET next_attempt_at = coalesce($1::timestamptz, now())
	WHERE status = 'pending' AND last_error_class = 'permanent'
	  AND next_attempt_at > coalesce($1::timestamptz, now())`

// retryPermanentNow makes rows held back by a permanent error due at once:
// a new process usually means a new configuration.
func (d *Dispatcher) retryPermanentNow(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	if _, err := d.pool.Exec(ctx, sqlRetryPermanent, d.now()); err != nil {
		return fmt.Errorf("retry alerts held back by a permanent error: %w", err)
	}
	return nil
}

// sqlClaim leases due rows in one statement, so the lease is committed
// before anything is posted and no row lock is held while Slack answers.
// SKIP LOCKED lets concurrent dispatchers take disjoint rows; the lease
// condition keeps a row leased by a live pass from being taken again.
const sqlClaim = `WITH due AS (
		SELECT id FROM alert_outbox
		WHERE status = 'pending'
		  AND next_attempt_at <= coalesce($1::timestamptz, now())
		  AND (lease_expires_at IS NULL OR lease_expires_at <= coalesce($1::timestamptz, now()))
		ORDER BY next_attempt_at, id
		LIMIT $2
		FOR UPDATE SKIP LOCKED
	)
	UPDATE alert_outbox o
	SET lease_owner = $3, lease_expires_at = coalesce($1::timestamptz, now()) + $4::interval
	FROM due WHERE o.id = due.id
	RETURNING o.id, o.reason, o.kind, coalesce(o.tool, ''), coalesce(o.key, ''), o.details::text,
	          o.created_at, o.attempts, coalesce($1::timestamptz, now())`

func (d *Dispatcher) claim(ctx context.Context, token string) (time.Time, []item, error) {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	now := time.Now()
	if t := d.now(); t != nil {
		now = *t
	}
	rows, err := d.pool.Query(ctx, sqlClaim, d.now(), d.cfg.BatchSize, token, d.cfg.Lease)
	if err != nil {
		return now, nil, fmt.Errorf("claim due alerts: %w", err)
	}
	var items []item
	var it item
	var reason, kind, details string
	_, err = pgx.ForEachRow(rows, []any{&it.id, &reason, &kind, &it.tool, &it.key, &details, &it.createdAt, &it.attempts, &now}, func() error {
		it.reason, it.kind = Reason(reason), Kind(kind)
		it.details = Details{}
		if err := json.Unmarshal([]byte(details), &it.details); err != nil {
			// Never dropped for it: the message shows what it can.
			d.logger.Debug("alert details unreadable", "id", it.id, "err", err)
		}
		items = append(items, it)
		return nil
	})
	if err != nil {
		return now, nil, fmt.Errorf("claim due alerts: %w", err)
	}
	return now, items, nil
}

// collapse keeps, per reason and subject (key, tool for tool-wide alerts,
// or worker for shards_unreachable), only the newest notice of the pass:
// when a firing notice and its resolved notice are both pending (at
// start-up a purge pass and a reconcile pass may raise and resolve the
// same key before any dispatch), on-call gets one message with the final
// state, not FIRING then RESOLVED. The older notices are settled with it
// (marked sent together), and a resolved notice that swallowed a firing
// one says so.
func collapse(items []item) []item {
	type subject struct{ reason, tool, key, node string }
	subj := func(it item) subject {
		if it.key != "" {
			return subject{reason: string(it.reason), key: it.key}
		}
		// A worker's notices have no tool either: two workers are two
		// subjects, never one.
		return subject{reason: string(it.reason), tool: it.tool, node: it.node()}
	}
	newest := map[subject]int{}
	for i, it := range items {
		s := subj(it)
		if j, ok := newest[s]; !ok || items[j].id < it.id {
			newest[s] = i
		}
	}
	if len(newest) == len(items) {
		return items
	}
	out := make([]item, 0, len(newest))
	for i, it := range items {
		if newest[subj(it)] != i {
			continue
		}
		for j, older := range items {
			if j != i && subj(older) == subj(it) {
				it.supersedes = append(it.supersedes, older.id)
				it.firedToo = it.firedToo || older.kind == KindFiring
			}
		}
		out = append(out, it)
	}
	return out
}

// groupItems makes one group per kind and reason, and per worker for
// alerts about a Citus worker (each worker's outage is a message of its
// own, never merged with a tool's or another worker's): firing before
// resolved, reasons in the order of Reasons, then workers by name, items
// oldest first.
func groupItems(items []item) []group {
	byKey := map[[3]string]*group{}
	var out []*group
	for _, it := range items {
		k := [3]string{string(it.kind), string(it.reason), it.node()}
		g, ok := byKey[k]
		if !ok {
			g = &group{kind: it.kind, reason: it.reason, node: it.node()}
			byKey[k] = g
			out = append(out, g)
		}
		g.items = append(g.items, it)
	}
	rank := func(r Reason) int {
		if i := slices.Index(Reasons, r); i >= 0 {
			return i
		}
		return len(Reasons)
	}
	slices.SortFunc(out, func(a, b *group) int {
		return cmp.Or(
			cmp.Compare(kindRank(a.kind), kindRank(b.kind)),
			cmp.Compare(rank(a.reason), rank(b.reason)),
			strings.Compare(string(a.reason), string(b.reason)),
			strings.Compare(string(a.kind), string(b.kind)),
			strings.Compare(a.node, b.node),
		)
	})
	res := make([]group, len(out))
	for i, g := range out {
		slices.SortFunc(g.items, func(a, b item) int {
			return cmp.Or(a.createdAt.Compare(b.createdAt), cmp.Compare(a.id, b.id))
		})
		res[i] = *g
	}
	return res
}

func kindRank(k Kind) int {
	if k == KindFiring {
		return 0
	}
	return 1
}

// afterPost is the context for bookkeeping once Slack has answered: a
// shutdown must not keep a delivered message from being marked sent, which
// would post it again.
func afterPost(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
}

const sqlMarkSent = `UPDATE alert_outbox
	SET status = 'sent', sent_at = coalesce($1::timestamptz, now()), attempts = attempts + 1,
	    last_attempt_at = coalesce($1::timestamptz, now()), lease_owner = NULL, lease_expires_at = NULL
	WHERE id = ANY($2) AND lease_owner = $3 AND status = 'pending'`

// markSent records delivery, conditional on this pass's lease. It returns
// how many rows it marked.
func (d *Dispatcher) markSent(ctx context.Context, g group, token string) (int, error) {
	ctx, cancel := afterPost(ctx)
	defer cancel()
	tag, err := d.pool.Exec(ctx, sqlMarkSent, d.now(), g.ids(), token)
	if err != nil {
		d.logger.Error("alert message posted but not marked sent: it will be posted again once its lease expires",
			"reason", string(g.reason), "kind", string(g.kind), "alerts", len(g.items), "err", err)
		return 0, fmt.Errorf("mark %d %s alerts sent: %w", len(g.items), g.reason, err)
	}
	return int(tag.RowsAffected()), nil
}

const sqlMarkFailed = `UPDATE alert_outbox
	SET attempts = attempts + 1, next_attempt_at = coalesce($1::timestamptz, now()) + $2::interval,
	    last_error = $3, last_error_class = $4, last_attempt_at = coalesce($1::timestamptz, now()),
	    lease_owner = NULL, lease_expires_at = NULL
	WHERE id = ANY($5) AND lease_owner = $6 AND status = 'pending'`

// markFailed keeps the rows pending with one more attempt and their next
// try after the back-off.
func (d *Dispatcher) markFailed(ctx context.Context, g group, token string, f failure) error {
	ctx, cancel := afterPost(ctx)
	defer cancel()
	if _, err := d.pool.Exec(ctx, sqlMarkFailed, d.now(), f.delay, f.err, string(f.class), g.ids(), token); err != nil {
		return fmt.Errorf("record failed delivery of %d %s alerts: %w", len(g.items), g.reason, err)
	}
	return nil
}

const sqlDefer = `UPDATE alert_outbox
	SET next_attempt_at = coalesce($1::timestamptz, now()) + $2::interval,
	    last_error = $3, last_error_class = $4, lease_owner = NULL, lease_expires_at = NULL
	WHERE id = ANY($5) AND lease_owner = $6 AND status = 'pending'`

// deferGroup puts off rows not tried because an earlier message of the pass
// failed in a way that would fail them too (rate limit, outage, bad
// token): same delay, no attempt counted.
func (d *Dispatcher) deferGroup(ctx context.Context, g group, token string, f failure) error {
	ctx, cancel := afterPost(ctx)
	defer cancel()
	if _, err := d.pool.Exec(ctx, sqlDefer, d.now(), f.delay, f.err, string(f.class), g.ids(), token); err != nil {
		return fmt.Errorf("defer %d %s alerts: %w", len(g.items), g.reason, err)
	}
	return nil
}

const sqlRelease = `UPDATE alert_outbox SET lease_owner = NULL, lease_expires_at = NULL
	WHERE id = ANY($1) AND lease_owner = $2 AND status = 'pending'`

// release gives rows back untouched: due again at once. If it fails, the
// lease expires and the rows are due then.
func (d *Dispatcher) release(ctx context.Context, g group, token string) error {
	ctx, cancel := afterPost(ctx)
	defer cancel()
	if _, err := d.pool.Exec(ctx, sqlRelease, g.ids(), token); err != nil {
		return fmt.Errorf("release %d %s alerts: %w", len(g.items), g.reason, err)
	}
	return nil
}
