// Package interact turns Slack interactions on ledgerkeeper's alert messages
// into operator actions: on-call inspects, holds, releases, marks retryable
// or stores an outcome from the alert itself, through package operator
// exactly as the command line does (compare-and-set, the same refusals, the
// same audit rows).
//
// # Slack actions are operator actions
//
// Nothing here writes the ledger except through operator.Resolve,
// operator.Hold and operator.Release, with the serve configuration's
// windows (Config.Windows: in flight is judged by the database's clock,
// as the CLI's resolve judges it). No Slack action can Force: a key in
// flight, a 5xx outcome and a held key are refused as the CLI refuses them
// without --force; replacing a hold is left to `ledgerkeeper hold
// --replace`. The one row interact writes itself is the audit row of a
// refused user (below), and the seen-set.
//
// # Who did it
//
// The actor of every audit row and hold is exactly slack:<user id>. The
// operator's mapped name (Config.Operators) goes where the CLI writes its
// reason, so it reads with the decision: a hold's reason and a resolve's
// reason (in the audit row's evidence) end in "(by alice via Slack)"; a
// release, which has no reason, carries the note "released (by alice via
// Slack)" in its audit row's error column, where a hold keeps its reason.
// The alert message gains a context line per action, "alice marked `KEY`
// retryable at 13:02 UTC"; once an action settles the key (Mark retryable,
// Store outcome), the message keeps only its Inspect button, so nobody acts
// on the key from a stale alert (a grouped message's menu stays, and a
// click on it is told the key is settled).
//
// # The actions
//
//   - Inspect (lk_inspect): answers the user alone (ephemeral) with what
//     `ledgerkeeper inspect` shows: the row judged by the database's clock,
//     the reconcile state of its current claim, the hold, open alerts and
//     the newest 5 audit entries; everything from the ledger redacted and
//     escaped. Changes nothing.
//   - Hold (lk_hold): a form asks for the reason, then operator.Hold.
//   - Release (lk_release): operator.Release, after Slack's confirmation
//     on the buttons (an overflow menu's options cannot ask for one).
//   - Mark retryable (lk_retryable): Slack's confirmation says what the
//     retry will do ("the next retry of KEY will run TOOL again"), a form
//     asks for the reason, then operator.Resolve with MarkRetryable.
//   - Store outcome (lk_outcome): a form asks for the status code, the JSON
//     body and the reason; mistakes come back under their fields (a 5xx,
//     not a number, not JSON, no reason; the operator package's Validate
//     has the last word); then a pushed confirmation says what every retry
//     will receive; its submission is operator.Resolve with MarkCompleted.
//
// A settled key (completed, or failed_retryable for Mark retryable) is
// told at the click, with no form; the submission is judged again by the
// operator package, so a key the reconciler or the original attempt
// settled while the form was open is refused there, nothing written. A
// form judges the attempt it was opened on: it shows that attempt's
// claimed_at and carries it to operator.Resolve (ResolveRequest.ClaimedAt),
// so a key a retry re-claimed while the form was open is refused ("claimed
// again since it was judged"): what the operator checked downstream was
// the earlier attempt, and marking the new one retryable could redo an
// effect it had. Two
// operators acting on one key at once: the row lock and compare-and-set of
// the operator package let one win; the other is told why nothing
// happened. The answer (ephemeral, through the interaction's response_url,
// else chat.postEphemeral; sent after the acknowledgement, below) says in
// plain words what happened or why it was refused. A resolve resolves the key's open alerts in its transaction
// (operator.Resolve); a hold or release does not, as on the CLI.
//
// A form carries the key, the alert message (channel, ts) and the
// response_url in its private_metadata, so the submission can answer and
// update the message. Every update reads the message back with
// conversations.history, then chat.update keeps its blocks, one update of
// a message at a time (so two quick actions each add their line): the bot
// needs channels:history, or groups:history in a private channel, besides
// chat:write; without it a button's update uses the copy of the message
// its click carried, and a form's leaves the message as it is.
//
// # Grouped messages
//
// A message about one key carries the five buttons; a message listing
// several keys gives each an overflow menu of the five actions (Slack's
// five options; values "ACTION_ID:KEY" within 150 characters, so any key
// of the column's 128 fits); a message counting more keys than it lists
// adds a picker of the rest (up to 100), whose answer is the picked key's
// buttons, acting on the alert message (their block_id names it,
// alerts.OriginBlockID). alerts.Config.Interactive switches all of it on;
// resolved notices never carry controls.
//
// # Several ledgers
//
// A serve process keeping several ledgers (the configuration's ledgers
// section) runs one dispatcher per ledger, all posting to one channel,
// and one Handler over them all (Config.Ledgers: each ledger's pool, in
// its schema, and windows; daemon.BuildFleetInteractivity). Each
// dispatcher names its ledger (alerts.Config.Ledger): the header ends
// "· ledger NAME", the notification text starts "Ledger NAME:", every
// command quoted carries --ledger NAME, and every control's value is
// alerts.ControlValue, "NAME|KEY" (a ledger's name cannot hold "|", so the
// first one ends it whatever the key holds; alerts.ParseLedgerValue reads
// it strictly). An action acts on the pool of the ledger its value names
// and on no other; its answer and its form name the ledger, and the form
// carries it in its private_metadata. A value naming a ledger the Handler
// does not keep, or naming none (a bare key: a message posted before the
// ledgers section), and a form naming a ledger not kept, change nothing:
// the user is told which ledgers there are, and the attempt is logged
// (there is no ledger to audit it in). The actor of every audit row and
// hold is then slack:<user id> (ledger NAME); with one ledger it stays
// slack:<user id> and values stay bare keys. The seen-set is kept in one
// ledger's slack_seen (Config.Pool, else the first ledger by name), so a
// delivery is recognised whichever ledger it concerns. A menu option's
// 150 characters hold the ledger's name too: a key longer than 136 minus
// the name's length (128 keys fit beside names of up to 8) gets no menu in
// a grouped message nor a place in its picker (its one-key message's
// buttons, up to 2000 characters, always carry it).
//
// # Authorization
//
// Only Slack users in Config.Operators may act, each optionally limited to
// some actions (Operator.Actions; empty: all). Anyone else, at the click
// and again at a form's submission, is answered "not allowed" saying
// exactly what is missing (a user not in Config.Operators: their user ID
// is not listed; a listed operator: the action they lack and the actions
// they have), logged, and audited on the key when it is in the ledger: a reconcile_audit row with verdict "operator", action
// ActionSlackRefused ("slack_refused"), actor slack:<user id> and what was
// attempted. It changes nothing else: the key's status, hold and alerts
// stay, and no self-check or decision reads that action.
//
// # Transports and the seen-set
//
// Handle takes one interaction payload (block_actions or view_submission)
// whichever transport brought it: Socket Mode (socketmode.go) or the HTTP
// endpoint HTTPHandler, which verifies Slack's signature over the raw body
// (slack.NewSecretsVerifier: HMAC-SHA256 with the signing secret,
// timestamps more than 5 minutes off refused, 401) and refuses a replayed
// request (409) before anything else.
//
// Claim is the seen-set, table slack_seen, shared by replicas through the
// database (INSERT … ON CONFLICT, one winner; an expired identity may be
// claimed again; expired rows deleted in bounded batches by the claims that
// follow). Identities: a signed request's timestamp and signature (the
// replay), a click's user + action_ts + action_id, and a form's view id +
// hash, claimed once the form is complete (a form sent back with errors
// can be submitted again). So the same action, delivered twice by a retry,
// by both transports or to two replicas, is handled once, by one replica.
//
// # Acknowledged within Slack's 3 seconds
//
// Slack waits 3 seconds for an interaction's acknowledgement (the HTTP
// response, or the Socket Mode ack) and shows the user an error after
// that. Handle returns the acknowledgement once the interaction is
// decided in the database, and never waits on Slack:
//
//	before the ack (database only)        after the ack (follow-ups: Slack)
//	─────────────────────────────         ─────────────────────────────────
//	signature, replay, seen-set claim     views.open (started at once)
//	authorization; a refusal's audit row  the answer (response_url, else
//	form validation → response_action       chat.postEphemeral)
//	  errors / push (the confirmation)    the alert's update (conversations.
//	operator.Hold / Release / Resolve       history, chat.update, else the
//	  (one transaction, audited)            response_url's replace_original)
//
// The operator action happens before the ack, for three reasons. The
// user is told "done" only by a follow-up, which exists only once the
// action is committed with its audit row; a crash after the ack loses a
// message, never the act or its audit. The ack of a form must carry its
// errors or its confirmation, which need the database anyway. And the
// seen-set claim precedes the act, so a second delivery of the same
// interaction (a retry, both transports, two replicas, a Socket Mode
// redelivery) acts at most once. Its latency is the database's
// (milliseconds; bounded by Config.DecideTimeout, and not cancelled when
// Slack hangs up), not Slack's: against a Slack answering every call in
// 1.5 s, every kind of interaction was acknowledged within 70 ms over HTTP
// and Socket Mode (TestEveryInteractionIsAcknowledgedWhileSlackIsSlow).
//
// A form cannot wait: its trigger_id opens it only within TriggerTTL (3
// seconds) of the click, so views.open starts beside the acknowledgement,
// is retried only within that time, and the user is told when it could
// not open. The other follow-ups run after the ack on goroutines the
// Handler owns, each attempt bounded by Config.FollowUpTimeout; a failure
// that may pass (Slack's 5xx or 429, the network, a timeout) is retried
// with back-off (internal/backoff; a 429's Retry-After) up to
// Config.FollowUpAttempts, each failed attempt logged at Warn (redacted;
// a response_url never), the last at Error; Slack's refusals
// (expired_trigger_id, message_not_found, …) are not retried. A retried
// alert update adds its line once.
//
// Stop (serve's services: after Socket Mode, before the listener shuts
// down) refuses new interactions (HTTP 503, a Socket Mode envelope left
// unacknowledged for Slack to redeliver; nothing done), waits for those in
// hand and their follow-ups up to Config.StopGrace, then cancels what is
// left, logged. Settle waits for the follow-ups (the demo, tests).
//
// # Secrets
//
// The signing secret is registered in the Redactor (HTTPHandler) and the
// bot token is the caller's to register; errors are redacted before they
// are logged; a response_url (a capability) is never logged (the
// redactor's patterns mask Slack's hooks URLs in errors). No answer, form
// or message carries a secret.
//
// # Wiring
//
// New builds a Handler from Config (a pool, or Ledgers, and a bot-token
// client are required). The alert renderer draws the controls only when the
// dispatcher's alerts.Config.Interactive is true; turn it on when a
// transport is configured, or the buttons would lead nowhere.
package interact
