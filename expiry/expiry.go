package expiry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/internal/settings"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// alertPage is how many expired processing keys one alert transaction
// handles.
const alertPage = 100

// maxConsecutiveTimeouts ends a pass whose batches keep timing out even at
// the smallest size: something else is wrong (a lock held for minutes, a
// dying disk) and a human should look.
const maxConsecutiveTimeouts = 5

// Config configures a Purger. Each setting is declared once, here: its
// `yaml` key in the configuration file's retention section (internal/config
// decodes the section into this struct), its `default` (a zero value means
// it; the pacing defaults come from the measurements in BENCHMARKS.md) and
// its bounds (`min`, CheckSettings), applied and judged by
// internal/settings. Fields tagged `yaml:"-"` are wiring, or settings of
// other sections the daemon copies in. Alerts is required.
type Config struct {
	// Alerts raises the pass's expired_processing alerts and trims the
	// alert tables (package alerts owns them; internal/daemon.PurgeAlerts
	// is the implementation). Required.
	Alerts Alerts `yaml:"-"`
	// MinAge is the retention floor: a key younger than this (by
	// created_at) is never purged, whatever its expires_at.
	MinAge time.Duration `yaml:"min_age" default:"24h"`
	// Tools overrides MinAge per tool; a zero or negative min_age is
	// ignored.
	Tools map[string]ToolRetention `yaml:"tools"`
	// BatchSize is the most rows one batch deletes, and the size batches
	// start at and grow back to.
	BatchSize int `yaml:"batch_size" default:"1000" min:"0"`
	// BatchPause is the least pause between two batches; negative means
	// no floor (the duty cycle alone sets the pause).
	BatchPause time.Duration `yaml:"batch_pause" default:"50ms"`
	// MaxDuration is one pass's time budget: no batch starts after it, and
	// no pause that would end past it is taken.
	MaxDuration time.Duration `yaml:"max_duration" default:"10m"`
	// DutyCycle is the largest fraction of wall time spent inside DELETE
	// transactions, in (0, 1] (BENCHMARKS.md: 0.10 purged too slowly); 1
	// means no pause beyond BatchPause.
	DutyCycle float64 `yaml:"duty_cycle" default:"0.20"`
	// BatchTarget is the batch duration above which the next batch shrinks.
	BatchTarget time.Duration `yaml:"batch_target" default:"15ms"`
	// AuditMaxAge is how long the daemon's own rows live (audit, sent
	// alerts, resolved alert state, run records).
	AuditMaxAge time.Duration `yaml:"audit_max_age" default:"720h"`
	// BatchTimeout is the statement timeout of every statement of the pass;
	// a batch that hits it is rolled back and the next is a quarter the
	// size.
	BatchTimeout time.Duration `yaml:"-" default:"5s"`
	// RenotifyAfter is alerts.renotify_after: an expired processing key
	// already alerted more recently is not alerted again.
	RenotifyAfter time.Duration `yaml:"-" default:"4h"`
	// MaxAlertsPerPass bounds the expired_processing alerts one pass
	// raises; the rest wait for the next pass.
	MaxAlertsPerPass int `yaml:"-" default:"100"`
	// Actor names who runs the pass in ledgerkeeper_runs (replica id, or
	// the operator).
	Actor string `yaml:"-" default:"ledgerkeeper"`
	// Clock is the time source of the budget and the pacing. Default the
	// real clock; tests substitute their own.
	Clock Clock `yaml:"-"`
	// BatchShape is how a batch deletes the keys it chose (by keyset range,
	// ctid or primary key). Not a configuration key: lkbench compares the
	// shapes. Default store.DefaultPurgeShape (range).
	BatchShape store.PurgeShape `yaml:"-"`
}

// ToolRetention is one tool's retention override (retention.tools.T).
type ToolRetention struct {
	MinAge time.Duration `yaml:"min_age"`
}

// DefaultConfig returns a Config with every default applied.
func DefaultConfig() Config { return Config{}.withDefaults() }

// ToolMinAge is the floor of each tool that overrides MinAge.
func (c Config) ToolMinAge() map[string]time.Duration {
	floors := map[string]time.Duration{}
	for tool, t := range c.Tools {
		if t.MinAge > 0 {
			floors[tool] = t.MinAge
		}
	}
	return floors
}

func (c Config) withDefaults() Config {
	c.MinAge = max(c.MinAge, 0) // a negative floor is no floor: the default
	settings.ApplyDefaults(&c)
	c.BatchShape = cmp.Or(c.BatchShape, store.DefaultPurgeShape)
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c
}

// CheckSettings refuses a duty cycle outside (0, 1].
func (c *Config) CheckSettings(r *settings.Report) {
	if c.DutyCycle <= 0 || c.DutyCycle > 1 {
		r.Field(&c.DutyCycle, "must be in (0, 1], got %v", c.DutyCycle)
	}
}

// Validate refuses settings a purge cannot run with, after the defaults:
// every refusal is a *fielderr.Error naming the setting by its yaml path
// within the retention section; all are returned, joined. Alerts is not
// judged here: it is wiring, not a setting.
func (c Config) Validate() error {
	c = c.withDefaults()
	return settings.Validate(&c)
}

// mustValidate panics on values only a programming error produces:
// internal/daemon refuses them from operators first (Validate).
func (c Config) mustValidate() {
	switch {
	case c.BatchSize < 0:
		panic(fmt.Sprintf("expiry: negative BatchSize %d", c.BatchSize))
	case c.DutyCycle <= 0 || c.DutyCycle > 1:
		panic(fmt.Sprintf("expiry: DutyCycle %v outside (0, 1]", c.DutyCycle))
	case c.MaxDuration < 0 || c.BatchTarget < 0 || c.BatchTimeout < 0 || c.AuditMaxAge < 0 || c.RenotifyAfter < 0:
		panic("expiry: negative duration in Config")
	case c.MaxAlertsPerPass < 0:
		panic("expiry: negative MaxAlertsPerPass")
	case c.Alerts == nil:
		panic("expiry: Config.Alerts is required (internal/daemon.PurgeAlerts)")
	case !c.BatchShape.Known():
		panic(fmt.Sprintf("expiry: unknown BatchShape %q", c.BatchShape))
	}
}

func (c Config) policy() store.PurgePolicy {
	return store.PurgePolicy{MinAge: c.MinAge, ToolMinAge: c.ToolMinAge()}
}

// Purger runs purge passes. The daemon calls RunOnce on its schedule
// (schedule.purge); `ledgerkeeper purge` calls it once. Any number of
// Purgers, in any number of processes, may run at once: the advisory lock
// lets one work and the others report AlreadyRunning.
type Purger struct {
	cfg     Config
	pool    store.Pool
	logger  *slog.Logger
	metrics *Metrics
}

// New returns a Purger. logger and metrics may be nil.
func New(cfg Config, pool store.Pool, logger *slog.Logger, metrics *Metrics) *Purger {
	cfg = cfg.withDefaults()
	cfg.mustValidate()
	if pool == nil {
		panic("expiry: New needs a pool")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	p := &Purger{cfg: cfg, pool: pool, logger: logger, metrics: metrics}
	tables := []string{"idempotency_keys", "reconcile_state"}
	for _, t := range p.DaemonTables() {
		tables = append(tables, t.Name)
	}
	metrics.init(tables)
	return p
}

// Config returns the effective configuration, defaults filled in.
func (p *Purger) Config() Config { return p.cfg }

// Report is the result of one pass: what `ledgerkeeper purge` prints and
// ledgerkeeper_runs stores.
type Report struct {
	// AlreadyRunning: another purge held the lock; this pass did nothing.
	AlreadyRunning bool `json:"already_running"`
	// StartedAt and Duration frame the pass.
	StartedAt       time.Time     `json:"started_at"`
	Duration        time.Duration `json:"-"`
	DurationSeconds float64       `json:"duration_seconds"`
	// Deleted counts rows deleted per table, idempotency_keys first.
	Deleted []TableRows `json:"deleted"`
	// Keys breaks the deleted idempotency_keys rows down by tool and status.
	Keys []store.PurgeCount `json:"keys_by_tool_status"`
	// KeysDeleted is the total of Keys.
	KeysDeleted int64 `json:"keys_deleted"`
	// RowsPerSecond is KeysDeleted over the pass's duration.
	RowsPerSecond float64 `json:"rows_per_second"`
	// Batches counts batch transactions (all tables); TimedOutBatches those
	// of them rolled back by the statement timeout.
	Batches         int `json:"batches"`
	TimedOutBatches int `json:"timed_out_batches"`
	// LastBatchSize is the adaptive size the key purge ended with.
	LastBatchSize int `json:"last_batch_size"`
	// DutyCycle is the fraction of the pass spent inside batches.
	DutyCycle float64 `json:"duty_cycle"`
	// ExpiredProcessing counts processing keys past expires_at (kept);
	// ExpiredProcessingHeld those of them on hold (not alerted).
	ExpiredProcessing     int64 `json:"expired_processing"`
	ExpiredProcessingHeld int64 `json:"expired_processing_held"`
	// AlertsRaised counts expired_processing alerts put in the outbox (keys
	// alerted within renotify_after are not alerted again).
	AlertsRaised int `json:"alerts_raised"`
	// BudgetExhausted: the pass stopped because MaxDuration ran out; the
	// next pass carries on.
	BudgetExhausted bool    `json:"budget_exhausted"`
	BudgetSeconds   float64 `json:"budget_seconds"`
	// UnreachableShards lists the shards of a Citus ledger the pass could
	// not read (their worker did not answer): their keys were neither
	// purged nor alerted; the other shards' were.
	UnreachableShards []store.ShardFault `json:"unreachable_shards,omitempty"`
	// Error is set when the pass failed part-way (the report says what was
	// done before).
	Error string `json:"error,omitempty"`
}

// skipUnreachable records the shards a read could not reach in the report
// and returns nil for such a partial read, err otherwise.
func (r *Report) skipUnreachable(err error) error {
	e, ok := store.AsShardsUnreachable(err)
	if !ok {
		return err
	}
	for _, f := range e.Faults {
		if !slices.ContainsFunc(r.UnreachableShards, func(g store.ShardFault) bool { return g.Shard == f.Shard }) {
			r.UnreachableShards = append(r.UnreachableShards, f)
		}
	}
	return nil
}

// TableRows is a number of rows of one table.
type TableRows struct {
	Table string `json:"table"`
	Rows  int64  `json:"rows"`
}

// reportTables is the order of Report.Deleted.
var reportTables = []string{"idempotency_keys", "reconcile_state", "reconcile_audit", "alert_outbox", "alert_state", "ledgerkeeper_runs"}

func (r *Report) add(table string, n int64) {
	for i := range r.Deleted {
		if r.Deleted[i].Table == table {
			r.Deleted[i].Rows += n
			return
		}
	}
	r.Deleted = append(r.Deleted, TableRows{Table: table, Rows: n})
}

// DeletedFrom returns the rows deleted from table.
func (r Report) DeletedFrom(table string) int64 {
	for _, t := range r.Deleted {
		if t.Table == table {
			return t.Rows
		}
	}
	return 0
}

func (r *Report) addKeys(cs []store.PurgeCount) {
	for _, c := range cs {
		found := false
		for i := range r.Keys {
			if r.Keys[i].Tool == c.Tool && r.Keys[i].Status == c.Status {
				r.Keys[i].Keys += c.Keys
				if c.OldestExpiresAt.Before(r.Keys[i].OldestExpiresAt) {
					r.Keys[i].OldestExpiresAt = c.OldestExpiresAt
				}
				found = true
				break
			}
		}
		if !found {
			r.Keys = append(r.Keys, c)
		}
		r.KeysDeleted += c.Keys
	}
}

// RunOnce runs one purge pass: it takes the purge lock (or reports
// AlreadyRunning and returns), alerts expired processing keys, deletes
// expired keys in paced batches, trims the daemon's tables, and records the
// pass in ledgerkeeper_runs. On error the report says what was done before:
// every batch is its own transaction, so nothing half-done is lost.
func (p *Purger) RunOnce(ctx context.Context) (Report, error) {
	c := p.cfg
	start := c.Clock.Now()
	rep := Report{StartedAt: start, BudgetSeconds: c.MaxDuration.Seconds()}
	for _, t := range reportTables {
		rep.Deleted = append(rep.Deleted, TableRows{Table: t})
	}

	raw, err := p.dedicated(ctx)
	if err != nil {
		return rep, err
	}
	// The pass's statements are in the ledger's schema, as the pool's are.
	conn := ledger.SameSchema(p.pool, raw).(store.Beginner)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// Closing ends the session: the lock goes with it even if the
		// explicit unlock below could not be sent.
		_ = raw.Close(cctx)
	}()
	ok, err := store.TryPurgeLock(ctx, conn)
	if err != nil {
		return rep, fmt.Errorf("purge: %w", err)
	}
	if !ok {
		rep.AlreadyRunning = true
		p.logger.Info("purge already running elsewhere; this pass does nothing")
		p.metrics.observePass(rep, nil)
		return rep, nil
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = store.ReleasePurgeLock(cctx, conn)
	}()

	busy, err := p.pass(ctx, conn, &rep, start.Add(c.MaxDuration))
	rep.Duration = c.Clock.Now().Sub(start)
	rep.DurationSeconds = rep.Duration.Seconds()
	if rep.Duration > 0 {
		rep.RowsPerSecond = float64(rep.KeysDeleted) / rep.Duration.Seconds()
		rep.DutyCycle = float64(busy) / float64(rep.Duration)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	p.record(ctx, rep)
	p.metrics.observePass(rep, err)
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		// Shutdown: not worth an error line.
	case err != nil:
		p.logger.Error("purge pass failed", "err", err, "keys_deleted", rep.KeysDeleted, "batches", rep.Batches)
	case len(rep.UnreachableShards) > 0:
		e := &store.ShardsUnreachableError{Op: "purge", Faults: rep.UnreachableShards}
		p.logger.Warn("purge pass done without the shards of an unreachable Citus worker: their keys wait for it",
			"err", e.Error(), "keys_deleted", rep.KeysDeleted, "batches", rep.Batches)
	case rep.KeysDeleted > 0 || rep.AlertsRaised > 0 || rep.BudgetExhausted || rep.TimedOutBatches > 0:
		p.logger.Info("purge pass done", "keys_deleted", rep.KeysDeleted, "batches", rep.Batches,
			"duration", rep.Duration, "rows_per_second", int64(rep.RowsPerSecond),
			"expired_processing", rep.ExpiredProcessing, "alerts_raised", rep.AlertsRaised,
			"budget_exhausted", rep.BudgetExhausted, "timed_out_batches", rep.TimedOutBatches)
	default:
		p.logger.Debug("purge pass done: nothing to purge")
	}
	return rep, err
}

// dedicated takes a connection out of the pool for the pass: the advisory
// lock lives on it, and closing it at the end releases everything it holds.
func (p *Purger) dedicated(ctx context.Context) (*pgx.Conn, error) {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("purge: connect to the database: %w", err)
	}
	conn := pc.Hijack()
	if err := store.SetStatementTimeout(ctx, conn, p.cfg.BatchTimeout); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("purge: %w", err)
	}
	return conn, nil
}

// pass does the work of RunOnce under the lock and returns the time spent
// inside batches.
func (p *Purger) pass(ctx context.Context, conn store.Beginner, rep *Report, deadline time.Time) (time.Duration, error) {
	if err := p.alertExpired(ctx, conn, rep, deadline); err != nil {
		return 0, err
	}

	// The ledger itself.
	pc := newPacer(p.cfg)
	var cursor store.PurgeCursor
	out, err := p.paced(ctx, rep, pc, deadline, func(ctx context.Context, size int) (bool, error) {
		p.metrics.setBatchSize(size)
		res, err := store.PurgeExpiredBatchBy(ctx, conn, p.cfg.BatchShape, p.cfg.policy(), cursor, size)
		if err = rep.skipUnreachable(err); err != nil {
			return false, err
		}
		cursor = res.Next
		rep.add("idempotency_keys", res.Keys)
		rep.add("reconcile_state", res.States)
		rep.addKeys(res.ByToolStatus)
		p.metrics.deleted("idempotency_keys", res.Keys)
		p.metrics.deleted("reconcile_state", res.States)
		p.logger.Debug("purge batch", "size", size, "candidates", res.Candidates, "deleted", res.Keys)
		return res.Done, nil
	})
	rep.LastBatchSize = pc.size
	busy := pc.busy
	if err != nil {
		return busy, err
	}
	if out {
		rep.BudgetExhausted = true
		return busy, nil
	}

	// The daemon's own tables, each with a pacer of its own (their rows are
	// narrower than the ledger's).
	for _, t := range p.DaemonTables() {
		pc := newPacer(p.cfg)
		out, err := p.paced(ctx, rep, pc, deadline, func(ctx context.Context, size int) (bool, error) {
			n, err := t.Purge(ctx, conn, p.cfg.AuditMaxAge, size)
			if err = rep.skipUnreachable(err); err != nil {
				// Every table's batch that times out shrinks the next,
				// whichever package's statement it was.
				return false, store.AsBatchTimeout(err)
			}
			rep.add(t.Name, n)
			p.metrics.deleted(t.Name, n)
			return n < int64(size), nil
		})
		busy += pc.busy
		if err != nil {
			return busy, err
		}
		if out {
			rep.BudgetExhausted = true
			return busy, nil
		}
	}
	return busy, nil
}

// paced runs batch until it reports done, pacing by pc, and stops between
// batches when the budget runs out (then it returns true).
func (p *Purger) paced(ctx context.Context, rep *Report, pc *pacer, deadline time.Time,
	batch func(ctx context.Context, size int) (done bool, err error)) (bool, error) {
	clock := p.cfg.Clock
	timeouts := 0
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if !clock.Now().Before(deadline) {
			return true, nil
		}
		t0 := clock.Now()
		done, err := batch(ctx, pc.size)
		d := clock.Now().Sub(t0)
		timedOut := errors.Is(err, store.ErrBatchTimeout)
		if err != nil && !timedOut {
			return false, err
		}
		rep.Batches++
		p.metrics.observeBatch(d, timedOut)
		if timedOut {
			rep.TimedOutBatches++
			timeouts++
			p.logger.Warn("purge batch timed out; shrinking", "size", pc.size, "duration", d, "err", err)
			if timeouts >= maxConsecutiveTimeouts {
				return false, fmt.Errorf("%d purge batches in a row timed out (the last of %d rows); is something holding locks on the ledger for minutes? %w", timeouts, pc.size, err)
			}
		} else {
			timeouts = 0
		}
		pause := pc.observe(d, timedOut)
		if done && !timedOut {
			return false, nil
		}
		if !clock.Now().Add(pause).Before(deadline) {
			return true, nil
		}
		if err := clock.Sleep(ctx, pause); err != nil {
			return false, err
		}
	}
}

// alertExpired counts expired processing keys and raises one alert per key
// (bounded per pass), each page in the transaction that reads it.
func (p *Purger) alertExpired(ctx context.Context, conn store.Beginner, rep *Report, deadline time.Time) error {
	total, held, err := store.CountExpiredProcessing(ctx, conn)
	if err = rep.skipUnreachable(err); err != nil {
		return err
	}
	rep.ExpiredProcessing, rep.ExpiredProcessingHeld = total, held
	defer func() { p.metrics.observeExpired(rep.ExpiredProcessing, rep.AlertsRaised) }()
	if total-held == 0 {
		return nil
	}
	var cursor store.PurgeCursor
	for rep.AlertsRaised < p.cfg.MaxAlertsPerPass && p.cfg.Clock.Now().Before(deadline) {
		var n int
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			keys, err := store.ExpiredProcessingPage(ctx, tx, cursor, alertPage)
			if err = rep.skipUnreachable(err); err != nil {
				return err
			}
			n = len(keys)
			for _, k := range keys {
				if rep.AlertsRaised >= p.cfg.MaxAlertsPerPass {
					break
				}
				cursor = store.PurgeCursor{ExpiresAt: k.ExpiresAt, Key: k.Key}
				raised, err := p.cfg.Alerts.ExpiredProcessing(ctx, tx, k, p.cfg.RenotifyAfter)
				if err != nil {
					return err
				}
				if raised {
					rep.AlertsRaised++
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("alert expired processing keys: %w", err)
		}
		if n < alertPage {
			break
		}
	}
	if rep.AlertsRaised > 0 {
		p.logger.Warn("expired processing keys alerted: purge keeps them until resolved",
			"expired_processing", total, "alerts_raised", rep.AlertsRaised)
	}
	return nil
}

// record stores the pass in ledgerkeeper_runs, on the pool: the pass's own
// connection may be the thing that failed.
func (p *Purger) record(ctx context.Context, rep Report) {
	stats, err := json.Marshal(rep)
	if err != nil {
		p.logger.Error("encode purge report", "err", err)
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := store.RecordRun(rctx, p.pool, store.Run{
		Kind: "purge", Actor: p.cfg.Actor, StartedAt: rep.StartedAt, Stats: stats, Error: rep.Error,
	}); err != nil {
		p.logger.Warn("could not record the purge pass", "err", err)
	}
}

// DryRunReport is what a purge would do now; a dry run deletes nothing and
// raises nothing.
type DryRunReport struct {
	// PurgeRunning: a purge holds the lock right now (its deletions race
	// with these counts).
	PurgeRunning bool `json:"purge_running"`
	// Keys counts the keys a pass would delete, per tool and status.
	Keys []store.PurgeCount `json:"would_purge"`
	// TotalKeys is their sum; OldestExpiresAt the oldest among them.
	TotalKeys       int64      `json:"would_purge_total"`
	OldestExpiresAt *time.Time `json:"oldest_expires_at,omitempty"`
	// UnderFloor counts expired resolved keys kept because they are
	// younger than their retention floor.
	UnderFloor int64 `json:"kept_under_floor"`
	// Held counts expired resolved keys kept because they are on hold (held
	// processing keys are in ExpiredProcessingHeld, so each key is counted
	// once).
	Held int64 `json:"kept_held"`
	// ExpiredProcessing counts expired processing keys (kept);
	// ExpiredProcessingHeld those on hold, which are not alerted.
	ExpiredProcessing     int64 `json:"expired_processing"`
	ExpiredProcessingHeld int64 `json:"expired_processing_held"`
	// WouldAlert lists the first expired processing keys a pass would
	// alert, at most MaxAlertsPerPass, those alerted within renotify_after
	// included (a pass skips them: the dry run does not read alert_state);
	// empty, never null, when there is none.
	WouldAlert []store.ExpiredKey `json:"would_alert"`
	// Tables counts the daemon-table rows a pass would delete, in the order
	// a pass trims them.
	Tables []TableRows `json:"daemon_tables"`
	// MinAgeSeconds, ToolMinAgeSeconds and AuditMaxAgeSeconds are the
	// policy the counts were made with.
	MinAgeSeconds      float64            `json:"min_age_seconds"`
	ToolMinAgeSeconds  map[string]float64 `json:"tool_min_age_seconds,omitempty"`
	AuditMaxAgeSeconds float64            `json:"audit_max_age_seconds"`
}

// DryRun reports what RunOnce would delete and alert now, without deleting
// or raising anything and without taking the lock. It reads every expired
// row once (an operator command, not a hot path), within MaxDuration.
func (p *Purger) DryRun(ctx context.Context) (DryRunReport, error) {
	c := p.cfg
	ctx, cancel := context.WithTimeout(ctx, c.MaxDuration)
	defer cancel()
	rep := DryRunReport{
		MinAgeSeconds:      c.MinAge.Seconds(),
		AuditMaxAgeSeconds: c.AuditMaxAge.Seconds(),
		WouldAlert:         []store.ExpiredKey{},
	}
	if floors := c.ToolMinAge(); len(floors) > 0 {
		rep.ToolMinAgeSeconds = map[string]float64{}
		for t, d := range floors {
			rep.ToolMinAgeSeconds[t] = d.Seconds()
		}
	}
	var err error
	if rep.PurgeRunning, err = store.PurgeRunning(ctx, p.pool); err != nil {
		return rep, err
	}
	prev, err := store.PreviewPurge(ctx, p.pool, c.policy())
	if err != nil {
		return rep, err
	}
	rep.Keys, rep.UnderFloor, rep.Held = prev.Purgeable, prev.UnderFloor, prev.Held
	for _, k := range prev.Purgeable {
		rep.TotalKeys += k.Keys
		if rep.OldestExpiresAt == nil || k.OldestExpiresAt.Before(*rep.OldestExpiresAt) {
			t := k.OldestExpiresAt
			rep.OldestExpiresAt = &t
		}
	}
	if rep.ExpiredProcessing, rep.ExpiredProcessingHeld, err = store.CountExpiredProcessing(ctx, p.pool); err != nil {
		return rep, err
	}
	// The preview's held count includes held processing keys, which are
	// reported as expired_processing_held: count each key once. (Two
	// statements, so a hold placed between them could make it negative.)
	rep.Held = max(rep.Held-rep.ExpiredProcessingHeld, 0)
	if rep.ExpiredProcessing > rep.ExpiredProcessingHeld {
		page, err := store.ExpiredProcessingPage(ctx, p.pool, store.PurgeCursor{}, c.MaxAlertsPerPass)
		if err != nil {
			return rep, err
		}
		rep.WouldAlert = append(rep.WouldAlert, page...)
	}
	for _, t := range p.DaemonTables() {
		n, err := t.Count(ctx, p.pool, c.AuditMaxAge)
		if err != nil {
			return rep, err
		}
		rep.Tables = append(rep.Tables, TableRows{Table: t.Name, Rows: n})
	}
	return rep, nil
}
