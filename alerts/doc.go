// Package alerts turns what ledgerkeeper cannot resolve into messages a
// human can act on.
//
// # Raising
//
// The outbox side (Raise, ResolveKey, ResolveTool) runs inside the
// transaction of the decision that raises the alert, so an alert exists if
// and only if its decision does (invariant 8). alert_state remembers the
// last alert per reason and subject (a key, or a tool for tool-wide
// alerts): a second Raise for the same reason and subject within
// renotify_after enqueues nothing, and ResolveKey/ResolveTool enqueue one
// "resolved" row per open alert (like Alertmanager's send_resolved). Keys
// resolved behind the reconciler's back (the original attempt completed)
// are found with OpenKeyAlertsAfter by the reconciler's sweep, which
// resolves a page of them at once with ResolveKeys (one statement).
//
// A Citus worker the coordinator cannot reach gets one alert of its own,
// shards_unreachable, whatever the number of keys on its shards: RaiseNode
// records it under the subject node:HOST:PORT with no tool and no key
// (NULL in alert_state and alert_outbox; the worker and its shards travel
// in details), ResolveNode ends it when the worker answers again, and
// OpenNodeAlerts lists the workers whose alert is open. Readers of the
// alert tables take tool and key as possibly NULL (coalesce).
//
// Retention: purge (package expiry, through its Alerts interface) trims
// sent outbox rows (PurgeSent) and resolved alert_state rows (TrimState)
// older than retention.audit_max_age, in bounded batches; pending alerts and
// open alert state are never deleted.
//
// # Delivering
//
// A Dispatcher delivers the outbox. Each row goes through:
//
//	Raise / ResolveKey, in the decision's transaction
//	      │
//	      ▼
//	pending, due at next_attempt_at ◄──────────────────────────┐
//	      │ claim: FOR UPDATE SKIP LOCKED + lease,             │
//	      │ committed before anything is posted                │
//	      ▼                                                    │
//	pending + leased ── lease expires (crash, kill -9) ────────┤
//	      │          ── released (shutdown, lease running out) ┤
//	      │ group by (kind, reason), render, Notify            │
//	      ├── refused / timed out: attempts + 1, last_error,   │
//	      │   last_error_class, next_attempt_at = back-off ────┘
//	      ▼ Slack took it
//	sent  (UPDATE … WHERE lease_owner = this pass; kept for
//	       history until purge's retention removes it)
//
// Back-off: BackoffBase·2^attempts capped at BackoffMax, with equal jitter;
// a 429's Retry-After is a floor, honoured exactly, and it holds back every
// post to that webhook or channel: while a rate-limited row's
// next_attempt_at is in the future no pass posts anything (alerts raised
// meanwhile wait too; Report.RateLimitedUntil, Health.RateLimitedUntil).
// A permanent error (bad token, channel not found, webhook removed) is
// retried by the running dispatcher after PermanentRetry·2^attempts capped
// at PermanentBackoff, without jitter (1m, 2m, 4m, 8m, then every 15m by
// default), is logged once per pass, counted in
// ledgerkeeper_alerts_delivery_failures_total{class="permanent"} and shown
// by Health (NextPermanentRetryAt, so by `ledgerkeeper status`) and by
// ledgerkeeper_alerts_next_attempt_timestamp_seconds; the first pass of
// each new Dispatcher retries such rows at once, so a fixed configuration
// works from the next restart or CLI run. After a
// failure that concerns Slack rather than one message (outage, rate limit,
// auth), the rest of the pass is deferred by the same delay without
// counting an attempt. Nothing is ever deleted or given up on here.
//
// # Exactly one sender, and the one duplicate
//
// Concurrent dispatchers (replicas, a CLI run beside `serve`) claim
// disjoint rows: SKIP LOCKED skips rows another claim is locking, and the
// lease condition skips rows another pass holds. Marking sent is
// conditional on this pass's lease token, and a post starts only if it can
// finish inside the lease (Lease > NotifyTimeout + 5s), so a row is never
// posted by two live dispatchers.
//
// The one duplicate possible: a process that dies (or loses its database)
// after Slack took a message and before the mark commits leaves the rows
// pending; once the lease expires another pass posts them again. Nothing
// can close that window without a transaction spanning Slack, which does
// not exist; Slack's webhook and chat.postMessage have no idempotency key.
// The mark runs on a context that a shutdown does not cancel, so an
// orderly stop (SIGTERM) does not open it. A pass cancelled while a post
// is in flight releases its rows, which may repeat that one message.
//
// # Messages
//
// One message per kind and reason per pass, and one per kind and worker
// for shards_unreachable (a worker's outage is never merged into a tool's
// message nor into another worker's): a header, what the reason
// means and its runbook section, then one section per alert (key, tool,
// age, attempts, last probe error or self-check answers, the exact
// `ledgerkeeper inspect` command and the commands that act on it, with the
// real key or tool and every required flag; only the outcome to record,
// --code CODE --body 'JSON', is left for the operator, written so that an
// unedited paste is refused) up to MaxKeysPerMessage, then "…and N more".
// A worker's section names it, the shards of idempotency_keys on it, what
// that means for their keys, the error Citus gave and how to check the
// worker; it has no key, so no command of ledgerkeeper and no control.
// When a pass claims several notices for one reason and subject (a firing
// and its resolved notice, raised and resolved before any dispatch), only
// the newest is posted and the others are marked sent with it; a resolved
// notice that swallowed a firing one says it fired and resolved. Everything taken from the
// ledger or a downstream is escaped for Slack mrkdwn (& < >) in verbatim
// text objects, so a key like <!channel> can neither ping anyone nor
// disguise a link; the only links are our own runbook links. Texts are cut
// to Slack's limits (50 blocks, 3000 characters per text object, 150 per
// header) between characters, never inside an entity.
//
// With Config.Interactive, firing messages carry controls (actions.go)
// that package interact handles: a message about one key its buttons
// (Inspect, Hold, Release, Mark retryable, Store outcome; value = the
// key), a message listing several keys an overflow menu per key, one
// counting more keys than it lists a picker of the rest; two blocks are
// kept free (the picker, and the line interact adds when someone acts).
// Resolved notices never carry controls, and the text fallback is the
// same either way.
//
// Config.Ledger names the ledger of a process that keeps several: its
// messages say so (the header ends "· ledger NAME", the text fallback
// starts "Ledger NAME:", every command carries --ledger NAME, console
// links open the ledger's pages, console/uipath) and every
// control's value is ControlValue, "NAME|KEY", which interact routes to
// that ledger (ParseLedgerValue). Empty, messages and values are exactly
// those of a single ledger.
//
// # Secrets
//
// A webhook URL and a token are secrets. Notifiers redact them from every
// error (net/http quotes the URL in *url.Error), so last_error, logs and
// Health never hold them. The configuration's redactor (Config.Redactor,
// SlackConfig.Redactor: every ${VAR} and *_file value) goes over every
// text a message carries, probe errors included, before it is rendered,
// and over delivery errors before they are stored.
package alerts
