package reconcile

import (
	"maps"
	"slices"

	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
)

// MaxBatchSize is the largest BatchSize Validate accepts.
const MaxBatchSize = 10000

// MaxSelfCheckSamples is the largest SelfCheckSamples Validate accepts: a
// few keys tell a broken probe from a good one.
const MaxSelfCheckSamples = 20

// Validate refuses settings the engine cannot run with. Zero means the
// default (see the Default constants), so only what is left after the
// defaults is judged. Every refusal is a *fielderr.Error naming the
// configuration key the setting is read from; all of them are returned,
// joined.
func (c Config) Validate() error {
	tools := c.Tools
	c.applyDefaults() // c is a copy; applyDefaults builds its own Tools map
	var errs fielderr.List
	positive := func(field string, v int) {
		if v < 0 {
			errs.Add(field, "must be positive, got %d", v)
		}
	}
	positive("reconcile.batch_size", c.BatchSize)
	positive("reconcile.concurrency", c.Concurrency)
	positive("reconcile.alert_after_attempts", c.AlertAfterAttempts)
	positive("reconcile.breaker.failures", c.BreakerFailures)
	positive("self_check.samples", c.SelfCheckSamples)
	if c.SelfCheckSamples > MaxSelfCheckSamples {
		errs.Add("self_check.samples", "at most %d, got %d: a few keys tell a broken probe from a good one", MaxSelfCheckSamples, c.SelfCheckSamples)
	}
	if c.BatchSize > MaxBatchSize {
		errs.Add("reconcile.batch_size", "at most %d, got %d", MaxBatchSize, c.BatchSize)
	}
	if c.BreakerMaxCooldown < c.BreakerCooldown {
		errs.Add("reconcile.breaker.max_cooldown", "must not be shorter than reconcile.breaker.cooldown (%s)", c.BreakerCooldown)
	}
	if c.BackoffMax < c.BackoffBase {
		errs.Add("reconcile.backoff_max", "must not be shorter than reconcile.backoff_base (%s)", c.BackoffBase)
	}
	for _, name := range slices.Sorted(maps.Keys(tools)) {
		if p := tools[name]; p.Concurrency < 0 {
			errs.Add("tools."+name+".concurrency", "must be positive, got %d", p.Concurrency)
		}
	}
	return errs.Err()
}
