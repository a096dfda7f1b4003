// Package probes answers one question for one idempotency key stuck in
// processing: does its side effect exist downstream?
//
// The reconcile engine acts on the answer, so the answer must be worth
// acting on. Each probe returns a Result whose Verdict is one of:
//
//	found      the effect exists; Outcome holds the response to store
//	           → the engine completes the key with that outcome
//	not_found  trustworthy evidence that the effect does not exist
//	           → the engine may mark the key failed_retryable (it runs again)
//	duplicate  more than one matching effect: idempotency was already
//	           violated downstream → the key stays processing, alert now
//	unknown    anything else: transport error, timeout, unexpected status,
//	           garbage → the key stays processing, retried with back-off
//
// # Trust rules
//
// Both definitive verdicts cause a write, and both can be wrong in a way that
// nobody notices later:
//
//   - a wrong not_found lets the agent retry an effect that already
//     happened: a second ticket, a second charge;
//   - a wrong found stores an outcome that never happened (a forged one)
//     or the wrong one, and every retry replays it forever.
//
// Unknown, by contrast, only costs time: the key stays processing, retries
// keep getting 409, and an operator is alerted once it has been unknown for
// too long. So every probe here turns anything it did not expect into
// Unknown, with an error that says why: a 3xx (redirects are never
// followed), 401, 429 or 5xx; a 404 without a JSON body, or one whose body
// does not match not_found_body; a body that is not JSON or is larger than the
// limit; a match that is a scalar, an array holding anything but non-empty
// objects, or a match path the answer does not have; a request placeholder
// that is missing, null, empty or not a scalar (probing with an empty value
// could match everything); a key that would be a "." or ".." path segment
// (URL normalisation would move the request up the path); a response_body
// field that is missing from the matched object (a partial outcome would be
// replayed forever); an outcome that a jsonb column cannot store; a SQL
// query that tries to write, returns no columns or a column twice, or whose
// parameter count differs from its args.
//
// Only these count as evidence of absence (not_found):
//
//   - from the http probe, an HTTP 404 whose Content-Type is JSON
//     (application/json or *+json) and whose body parses as JSON; when
//     not_found_body is set, its member at not_found_body.path must also
//     hold not_found_body.equals (a string equal to it, or a number or
//     boolean whose JSON text equals it). A HEAD answer has no body: a 404
//     with a JSON Content-Type is absence (not_found_body is refused with
//     HEAD). With not_found_on_404: any, every 404, whatever its body;
//   - from the http probe, a 2xx JSON answer whose match path is present
//     and holds null, [] or {} (with an empty match: the whole answer is
//     null, [] or {});
//   - from the sql probe, zero rows from its SELECT, run in a read-only
//     transaction.
//
// A 404 is not absence by itself. A router's or an ingress's own 404 for a
// path it does not know (a typo'd url, an API moved behind a new prefix)
// is HTML, text or empty, and a probe misconfigured so gets it for every
// key: read as absence, each key would be marked retryable whatever
// happened downstream. So a 404 without a JSON body is unknown ("a 404
// without a JSON body may come from a router, not the API", with its
// Content-Type and the first bytes of its body), and so is a JSON 404 that
// does not match not_found_body ("the 404's body does not say the effect
// is absent: error.code is "route_not_found", want "ticket_not_found"", or
// a missing member).
//
// A probe that cannot even be built for a key (a request placeholder the
// key's request body lacks, a body that is not JSON, an empty value, a
// dot-segment) is unknown with an error wrapping ErrNotRendered: the
// downstream was never asked, so such a result is neither absence nor
// Unreachable.
//
// Absence must be explicit. A 2xx answer that lacks the match path (a
// missing member such as `data` when the downstream renamed it `items`, an
// array index past the end, a segment that runs into a scalar, null or an
// array) is unknown, with an error that names the missing segment and the
// path ("match `data`: the answer has no member `data`: did the
// downstream's API change?"): a misspelt path or a changed API must never
// read as "no such effect", or a retry would redo an effect that exists.
//
// Paths (match, response_body) are dotted: "data", "data.items.0.id". The
// JSONPath spelling ("$.data[0].id") and the JSON Pointer spelling
// ("/data/0/id") are refused when the probe is built (and by config check),
// with the dotted form as a hint: a '$', '[' or ']' anywhere, or a leading
// '/'.
//
// # The sql probe stands on the protocol
//
// The sql probe's query must start with SELECT or WITH (NewSQL refuses
// anything else, for a clear message), and it always runs in ProbeExecMode
// (pgx's describe_exec, pinned on every query whatever the DSN or a
// caller's pool says): the extended protocol, where PostgreSQL parses the
// query as one prepared statement and itself refuses a second one ("cannot
// insert multiple commands into a prepared statement"). No hand-written
// scanner decides what is one statement. A database_url whose
// default_query_exec_mode is exec or simple_protocol is refused. The query
// runs in a READ ONLY transaction, on a session whose
// default_transaction_read_only is on, under statement and lock timeouts.
// SQLProbe.Check (config check --connect) prepares the query on the
// downstream without running it, to report a refused query, a parameter
// count that differs from args and a response_body column the query does
// not return before the first probe.
//
// Guard wraps any probe (built-in or written in Go) so that the same rules
// hold for code this package does not control: it gives the probe a
// deadline, turns a panic into Unknown, and turns any result that is not
// well formed (an unknown verdict string, a found without a valid outcome,
// a not_found that carries an error or an outcome, evidence that is not
// JSON) into Unknown. A probe returning garbage can never produce a write.
//
// # Secrets
//
// HTTP header values and the SQL database URL may carry secrets. They never
// appear in a Result's Err or Evidence: errors name the method, the path and
// query rendered from the URL template, the status and a short sanitised
// snippet of the body (with header values redacted); SQL errors are scrubbed
// of the password. Put secrets in headers, never in the URL template.
//
// # Probes written in Go
//
// A type implementing Probe (or a function wrapped in ProbeFunc) is
// registered under a tool name in a Registry that the daemon wiring owns;
// there is no global registry and no init() registration.
package probes
