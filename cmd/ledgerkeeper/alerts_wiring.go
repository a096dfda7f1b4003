package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/alerts"
	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// newDispatcher builds the alert dispatcher that `reconcile`, `purge` and
// `serve` run after their passes (serve also on schedule.alerts), from
// a.cfg.Alerts. It never returns a nil dispatcher: without any Slack
// configuration the notifier is alerts.NotConfigured, so alerts stay in the
// outbox, each pass counts a permanent failure and `ledgerkeeper status`
// shows "no Slack configured" instead of alerts vanishing silently.
func newDispatcher(a *app, pool store.Pool) (*alerts.Dispatcher, error) {
	return newDispatcherWithMetrics(a, pool, nil, a.logger)
}

// newDispatcherWithMetrics is newDispatcher with Prometheus series and
// serve's logger (with its replica), for `serve` (metrics :=
// alerts.NewMetrics(registry)).
func newDispatcherWithMetrics(a *app, pool store.Pool, metrics *alerts.Metrics, logger *slog.Logger) (*alerts.Dispatcher, error) {
	if err := a.load(); err != nil {
		return nil, err
	}
	return newDispatcherFor(a.cfg, "", pool, metrics, logger)
}

// newDispatcherFor is the dispatcher of ledger (named ledger in a process
// that keeps several; "" for the one ledger) configured by cfg.
func newDispatcherFor(cfg *config.Config, ledger string, pool store.Pool, metrics *alerts.Metrics, logger *slog.Logger) (*alerts.Dispatcher, error) {
	s := cfg.Alerts.Slack
	timeout := s.Timeout.D()
	notifier, err := alerts.NewSlack(alerts.SlackConfig{
		WebhookURL: s.WebhookURL.Reveal(),
		Token:      s.Token.Reveal(),
		Channel:    s.Channel,
		APIURL:     s.APIURL,
		Timeout:    timeout,
		Redactor:   cfg.Redactor(),
	})
	switch {
	case errors.Is(err, alerts.ErrNoSlack):
		logger.Warn("no Slack configured (alerts.slack.webhook_url, or alerts.slack.token and alerts.slack.channel): alerts stay in the outbox; see 'ledgerkeeper status'")
		notifier = alerts.NotConfigured{}
	case err != nil:
		return nil, &configError{err}
	}
	// One post may take the whole HTTP timeout; the lease must outlast a
	// few of them (alerts.Config.Lease).
	notifyTimeout := timeout + 5*time.Second
	return alerts.New(pool, alerts.Config{
		Lease:             max(alerts.DefaultLease, 4*notifyTimeout),
		NotifyTimeout:     notifyTimeout,
		MaxKeysPerMessage: cfg.Alerts.MaxKeysPerMessage,
		RunbookURL:        cfg.Alerts.RunbookURL,
		// Each key links to its page in the web console.
		ConsoleURL: cfg.Console.PublicURL,
		// In a process that keeps several ledgers: every message names
		// its ledger, every control carries it.
		Ledger: ledger,
		// Probe errors in messages lose every configured secret.
		Redactor: cfg.Redactor(),
		// Buttons only when a transport handles them (Settle refuses
		// interactive without one).
		Interactive: s.Interactive,
		// A held key's alert offers Release, the others Hold.
		Held: func(ctx context.Context, keys []string) (map[string]bool, error) {
			return store.HeldKeys(ctx, pool, keys)
		},
	}, notifier, logger.With("component", "alerts"), metrics), nil
}
