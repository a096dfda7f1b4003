package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

// DatabaseHealth is serve's view of the ledger database across failovers:
// it reports what the pool's ledger.Follower sees (one log line when the
// pool leaves a node that failed over, one when a writable primary answers
// again; ledgerkeeper_database_writable and
// ledgerkeeper_database_reconnects_total{reason}), answers /readyz (Ready:
// can the ledger be written now?), and, as a Service, asks every
// CheckEvery whether the node still takes writes, so a node that turned
// read-only without closing its sockets is left even when nothing writes.
type DatabaseHealth struct {
	writable   prometheus.Gauge
	reconnects *prometheus.CounterVec
	logger     *slog.Logger
	every      time.Duration

	follower *ledger.Follower
	pool     *pgxpool.Pool

	mu        sync.Mutex
	downSince time.Time
	cancel    context.CancelFunc
	done      chan struct{}
}

// DatabaseCheckEvery is how often serve checks that its node takes writes.
const DatabaseCheckEvery = time.Second

// databaseCheckTimeout bounds one writability check.
const databaseCheckTimeout = 3 * time.Second

// NewDatabaseHealth registers the database series with reg.
func NewDatabaseHealth(reg prometheus.Registerer, logger *slog.Logger) *DatabaseHealth {
	h := &DatabaseHealth{
		writable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ledgerkeeper_database_writable",
			Help: "1 while the ledger database takes writes (the last writability check, or the last failover seen, says so), else 0.",
		}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ledgerkeeper_database_reconnects_total",
			Help: "Times the pool left its database node and reconnected every connection, by the reason that showed the node failed over (read_only, recovery, shutdown, connection, not_writable).",
		}, []string{"reason"}),
		logger: logger,
		every:  DatabaseCheckEvery,
	}
	for _, r := range []string{ledger.ReasonReadOnly, ledger.ReasonRecovery, ledger.ReasonShutdown, ledger.ReasonConnection, ledger.ReasonNotWritable} {
		h.reconnects.WithLabelValues(r)
	}
	h.writable.Set(1)
	reg.MustRegister(h.writable, h.reconnects)
	return h
}

// FollowOptions are the hooks to give ledger.FollowPrimary (or
// ledger.NewPool) for the pool this DatabaseHealth watches.
func (h *DatabaseHealth) FollowOptions() ledger.FollowOptions {
	return ledger.FollowOptions{OnFailover: h.failedOver, OnWritable: h.writableNow}
}

// Watch names the pool and its Follower; call it before Start and Ready.
func (h *DatabaseHealth) Watch(pool *pgxpool.Pool, f *ledger.Follower) {
	h.pool, h.follower = pool, f
}

// failedOver is the one log line of a failover.
func (h *DatabaseHealth) failedOver(reason string, err error) {
	h.reconnects.WithLabelValues(reason).Inc()
	h.mu.Lock()
	if h.downSince.IsZero() {
		h.downSince = time.Now()
	}
	h.mu.Unlock()
	h.logger.Warn("database failed over: leaving its node, every connection reconnects to the URL's writable host; ledger writes wait until one answers",
		"reason", reason, "err", err)
}

func (h *DatabaseHealth) writableNow(w bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !w { // failedOver, called next, logs it
		h.writable.Set(0)
		if h.downSince.IsZero() {
			h.downSince = time.Now()
		}
		return
	}
	h.writable.Set(1)
	if !h.downSince.IsZero() {
		h.logger.Info("database writable again", "after", time.Since(h.downSince).Round(time.Millisecond).String())
		h.downSince = time.Time{}
	}
}

// Ready is /readyz's database check: the ledger can be written now (one
// round trip on the pool; a node that cannot take writes is left).
func (h *DatabaseHealth) Ready(ctx context.Context) error {
	if h.follower == nil {
		return errors.New("database health: no pool to watch")
	}
	return h.follower.CheckWritable(ctx, h.pool)
}

// Quiet reports whether a job's error needs no line of its own: the
// database is known not to take writes, and that was logged once.
func (h *DatabaseHealth) Quiet(err error) bool {
	if err == nil || h.follower == nil || errors.Is(err, context.Canceled) {
		return false
	}
	h.mu.Lock()
	down := !h.downSince.IsZero()
	h.mu.Unlock()
	return down || !h.follower.Writable()
}

// Start checks the database every DatabaseCheckEvery until Stop.
func (h *DatabaseHealth) Start(ctx context.Context) error {
	if h.follower == nil {
		return errors.New("database health: no pool to watch")
	}
	ctx, cancel := context.WithCancel(ctx)
	h.cancel, h.done = cancel, make(chan struct{})
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.every)
		defer t.Stop()
		for {
			cctx, ccancel := context.WithTimeout(ctx, databaseCheckTimeout)
			_ = h.follower.CheckWritable(cctx, h.pool)
			ccancel()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return nil
}

// Stop ends the checks; safe before Start.
func (h *DatabaseHealth) Stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	<-h.done
}
