// Package console is ledgerkeeper's web console: an http.Handler that
// serve mounts at /ui/ on its listener (http.console.enabled) and that
// `ledgerkeeper console` serves alone.
//
// Pages are rendered on the server with html/template (every value escaped
// by its context) from templates, stylesheets and one small script embedded
// with go:embed. The script (static/console.js) is the overview's refresh,
// loaded by the overview only: every 15 s it fetches the overview's live
// part as an HTML fragment (/ui/overview/live, live.go) and swaps it in,
// pausable; without it the pages work the same, refreshed by reloading.
// Every answer carries a strict Content-Security-Policy (default-src 'none';
// script-src and style-src 'self': no inline script or style; no frames,
// forms posting to the console only).
//
// # Who may see and do what
//
// Every request is authenticated by Config.Auth before anything is read:
// basic (HTTP Basic against bcrypt hashes), proxy (a trusted header such as
// X-Forwarded-User, believed only from Config.ProxyCIDRs), or none (one
// user, "local", allowed only when the listener is loopback: New refuses it
// otherwise). A signed-in user may read every page; acting needs a grant in
// Config.Operators (every action, or a list of them). Each state-changing
// request is a POST, checked in its own handler by the same grant the page
// used to draw the button (a hidden button is not a check): without it the
// answer is 403 and nothing is written. Cross-site POSTs are refused by Go's
// http.CrossOriginProtection before any handler runs.
//
// # Several ledgers
//
// A serve process that keeps several ledgers serves one console for all of
// them (Fleet, NewFleet): each ledger's pages, the same as a Handler's,
// under LedgerPath(name) (/ui/ledgers/billing/), every link, form, redirect,
// asset and the overview's live part under that path, each on the ledger's
// own pool (its schema); at Path the fleet's overview, every ledger with
// its keys in flight, stuck, failed_retryable and held, its firing alerts
// and open breakers; any other path, an unknown ledger's included, is 404.
// Every ledger's page carries a switcher: every ledger, each link going to
// the same page of it (its filter or key kept, a list's cursor not). One
// authenticator (one Basic realm, one sign-in limit, one proxy rule) and
// one cross-origin check stand in front of all of them, so one sign-in
// serves every ledger. The one-ledger console (New) is unchanged at Path.
//
// Who sees what: every signed-in user sees every ledger (reads are not
// scoped: the fleet is one team's); grants limit what they do. An entry of
// console.operators is an action on every ledger ("hold"), an action on
// one ledger ("billing:hold") or every action on one ledger ("billing:*");
// an empty list is every action on every ledger (ParseGrant, OperatorsOn).
// Each ledger's Handler holds the grants that apply to it and checks them
// in every POST as above: a user with no grant on billing gets 403 from
// billing's actions and nothing is written there. The audit trail names
// the ledger through the actor, console:<user> (ledger <name>); the
// one-ledger console keeps console:<user>.
//
// # Actions
//
// Hold, release, mark retryable and store outcome call the operator package,
// as the command line and Slack do, with the actor console:<user>, so they
// get the same refusals (in flight, held, a 5xx outcome, a key claimed again
// since the page was loaded: the form carries the claimed_at it showed) and
// the same audit rows. Every action, reconcile this key now included, is
// confirmed on a second page that repeats what every retry will receive;
// the first POST writes nothing.
//
// # Bulk actions
//
// Hold, release and mark retryable also apply to every key of a keys
// page's filter (bulk.go). GET /ui/bulk is the dry run, a read: the keys
// the act applies to (store.BulkKeys: not held, held, or stuck, which is
// what Resolve would not refuse by state), at most Config.Bulk.Limit + 1
// of them, listed with what every retry will receive. Its form carries the
// filter, the count, the dry run's instant and each key with its
// claimed_at; the user types the phrase ("hold 37"). The POST checks the
// grant, reads the set again and writes nothing unless it is the set
// confirmed (same count, same keys, a dry run under 15 minutes old), the
// phrase matches and a reason is given; then each key is acted on alone
// through the operator package, as a single key is (its audit row, its
// refusals; a resolve with the claimed_at the dry run listed), within
// Config.Bulk.Timeout, a refusal not stopping the others.
//
// # Probes, passes and alerts
//
// run.go draws what the reconciler, the probes and the alert outbox are
// doing: /ui/checks (each tool's last self-check sample by sample, its
// canaries, its breaker, and whether its probe may decide keys now, judged
// by the rules the reconciler applies), /ui/alerts (firing alerts with their
// last message's delivery and who acted from Slack, the outbox's messages,
// the last day's resolutions; an unreachable Citus worker's alert, about no
// tool and no key, is shown as the worker, linked to neither) and /ui/runs
// (ledgerkeeper_runs), the lists paged by keyset. Two buttons on a key's
// page use Config.Run: "probe now"
// (RunConfig.Probe, made by ProbeWith from an engine: the key's probe as
// `ledgerkeeper probe run` calls it, writing nothing; any signed-in user,
// one at a time per key and at most one per RunConfig.ProbeEvery) and
// "reconcile this key now" (grant reconcile; RunConfig.Reconciler builds an
// engine whose actor is console:<user>, and one pass restricted to the key
// runs on it, as `ledgerkeeper reconcile --key` runs: breaker, self-check,
// leases and holds apply, and the pass is recorded as the command line's
// are). Without them in RunConfig the buttons are absent and their POSTs
// refused.
//
// # What is shown
//
// Request and response bodies, evidence and errors pass through the one
// redactor (internal/secret) before they are rendered. The overview's chart
// of stuck keys over the last day is drawn on the server as inline SVG from
// the samples serve's observe job records (stuck_samples); a tool's probe
// pause (a downstream's Retry-After) is known only to the serve process
// whose engine keeps it (LiveConfig.ProbePauses).
package console
