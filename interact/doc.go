// Package interact turns Slack interactions on ledgerkeeper's alert messages
// into operator actions: on-call inspects, holds, releases, marks retryable
// or stores an outcome from the alert itself, through package operator
// exactly as the command line does (compare-and-set, the same refusals, the
// same audit rows).
//
// Slack actions are operator actions: nothing here writes the ledger
// except through operator.Resolve, operator.Hold and operator.Release, and
// no Slack action can Force.
//
// # Wiring
//
// New builds a Handler from Config. Handle takes one interaction payload
// (block_actions or view_submission) whichever transport brought it;
// HTTPHandler is the /slack/interactions endpoint (signature check, replay
// refusal, then Handle). Claim is the seen-set shared by replicas through
// the database (table slack_seen): a delivery handled by one replica is
// not handled again by another, nor twice by one.
//
// The alert renderer draws the action buttons only when the dispatcher's
// alerts.Config.Interactive is true; turn it on when a transport is
// configured, or buttons would lead nowhere.
package interact
