package probes

import (
	"cmp"
	"context"
	"database/sql/driver"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns bounds the connections an sql probe opens to its
// downstream when the config sets no limit: a probe must never crowd out the
// downstream's own clients.
const DefaultMaxConns = 4

// SQLConfig configures an sql probe. Zero values mean the documented
// defaults.
type SQLConfig struct {
	// DatabaseURL is the downstream PostgreSQL's connection string. It is a
	// secret: its password never appears in errors. Required unless Pool
	// is set. Connecting is lazy: an unreachable database makes probes
	// unknown, not NewSQL fail. Its default_query_exec_mode may be absent,
	// cache_statement, cache_describe or describe_exec (the probe runs
	// describe_exec whichever); exec and simple_protocol are refused (see
	// ProbeExecMode).
	DatabaseURL string
	// Query is one SELECT (or WITH … SELECT) with parameters $1…$n bound
	// from Args, e.g. "SELECT id AS charge_id, amount_cents FROM charges
	// WHERE idempotency_key = $1". PostgreSQL itself refuses a second
	// statement: the query is sent as one prepared statement (Parse).
	Query string
	// Args are the parameters' sources, in order: "key", "tool" or
	// "request.PATH" (a dotted path into the key's request body). The
	// query's parameter count must equal len(Args): PostgreSQL counts them
	// when it prepares the query (at the first probe, or at
	// `config check --connect`, see Check).
	Args []string
	// Timeout bounds one probe: connecting, the statement and waiting for
	// locks. Default DefaultTimeout.
	Timeout time.Duration
	// ResponseCode is the response_code a found outcome stores. Default
	// DefaultResponseCode.
	ResponseCode int
	// ResponseBody maps each field of the stored response_body to a column
	// of the row (by exact name) or to a JSON path into the row object
	// (e.g. "details.ticket.id" into a jsonb column). Empty: the whole row.
	ResponseBody map[string]string
	// MaxConns bounds the probe's own pool. Default DefaultMaxConns.
	MaxConns int
	// Pool, if set, is used instead of opening a pool for DatabaseURL, and
	// is not closed by Close.
	Pool *pgxpool.Pool
}

// SQLProbe asks a downstream PostgreSQL whether a key's effect exists, with
// a parameterised query in a read-only transaction. Create it with NewSQL;
// it is safe for concurrent use; Close it to release its pool.
type SQLProbe struct {
	pool     *pgxpool.Pool
	ownsPool bool
	query    string
	args     []*placeholder
	timeout  time.Duration
	code     int
	mapping  map[string]jsonPath
	// secret is the password, scrubbed from every error message.
	secret string
}

// ProbeExecMode is the pgx exec mode of every probe query, whatever the
// DSN says. It uses the extended protocol with an unnamed prepared
// statement (Parse, Describe, then Bind, Execute): PostgreSQL's Parse
// refuses a string of several statements ("cannot insert multiple commands
// into a prepared statement", SQLSTATE 42601), so a query such as
// "SELECT …; COMMIT; SET default_transaction_read_only = off; DELETE …"
// can never run, whatever text a hand-written scanner might misread. Of the
// modes that do this it describes the statement on every execution, so a
// schema changed downstream is never decoded with a stale description, and
// it holds no named statement that a transaction-pooling proxy could lose.
// The simple protocol (simple_protocol) runs every statement of the string;
// exec sends Parse too but without a description, and is refused with it so
// that one mode is the one tested.
const ProbeExecMode = pgx.QueryExecModeDescribeExec

// CheckExecMode refuses a database_url whose default_query_exec_mode would
// not send the probe's query as a prepared statement (exec,
// simple_protocol); see ProbeExecMode. A URL that does not parse is left to
// NewSQL, whose error is scrubbed of the password. config check calls it to
// name the key's line.
func CheckExecMode(databaseURL string) error {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil //nolint:nilerr // the exec mode alone is checked here; a bad URL is reported where the pool is opened
	}
	return checkExecMode(cfg.DefaultQueryExecMode)
}

func checkExecMode(m pgx.QueryExecMode) error {
	switch m {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec:
		return nil
	}
	return fmt.Errorf("database_url sets default_query_exec_mode=%s, which probes refuse: "+
		"a probe query must be sent as a prepared statement, so that PostgreSQL refuses a second statement in it; "+
		"remove the parameter (probes always run describe_exec)", execModeName(m))
}

// execModeName spells a mode as default_query_exec_mode does.
func execModeName(m pgx.QueryExecMode) string {
	switch m {
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return strings.ReplaceAll(m.String(), " ", "_")
}

// NewSQL validates cfg and returns an sql probe. It refuses a query that
// does not start with SELECT or WITH, and a database_url whose
// default_query_exec_mode would not use prepared statements. It does not
// connect: ctx only bounds setting the pool up; Check connects and prepares
// the query.
func NewSQL(ctx context.Context, cfg SQLConfig) (*SQLProbe, error) {
	if err := CheckQuery(cfg.Query); err != nil {
		return nil, fmt.Errorf("sql probe: %w", err)
	}
	p := &SQLProbe{
		query:   cfg.Query,
		timeout: cmp.Or(cfg.Timeout, DefaultTimeout),
		code:    cmp.Or(cfg.ResponseCode, DefaultResponseCode),
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("sql probe: negative timeout %s", cfg.Timeout)
	}
	if p.code < 100 || p.code > 599 {
		return nil, fmt.Errorf("sql probe: response_code %d is not an HTTP status code", p.code)
	}
	for i, a := range cfg.Args {
		ph, err := parsePlaceholder(a)
		if err != nil {
			return nil, fmt.Errorf("sql probe: args[%d]: %w", i, err)
		}
		p.args = append(p.args, ph)
	}
	var err error
	if p.mapping, err = parseMapping(cfg.ResponseBody); err != nil {
		return nil, fmt.Errorf("sql probe: %w", err)
	}

	if cfg.Pool != nil {
		p.pool = cfg.Pool
		return p, nil
	}
	if cfg.DatabaseURL == "" {
		return nil, errors.New("sql probe: database_url is required")
	}
	if cfg.MaxConns < 0 || cfg.MaxConns > math.MaxInt32 {
		return nil, fmt.Errorf("sql probe: max_conns %d out of range", cfg.MaxConns)
	}
	p.secret = urlPassword(cfg.DatabaseURL)
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// pgx redacts the password from its message; scrub again.
		return nil, p.scrub(fmt.Errorf("sql probe: database_url: %w", err))
	}
	if pcfg.ConnConfig.Password != "" {
		p.secret = pcfg.ConnConfig.Password
	}
	if err := checkExecMode(pcfg.ConnConfig.DefaultQueryExecMode); err != nil {
		return nil, fmt.Errorf("sql probe: %w", err)
	}
	// Pinned here and again on every query (a caller's Pool may say
	// otherwise): see ProbeExecMode.
	pcfg.ConnConfig.DefaultQueryExecMode = ProbeExecMode
	pcfg.MaxConns = int32(cmp.Or(cfg.MaxConns, DefaultMaxConns)) //nolint:gosec // G115: checked against math.MaxInt32 above
	pcfg.MinConns = 0
	rp := pcfg.ConnConfig.RuntimeParams
	if rp["application_name"] == "" {
		rp["application_name"] = "ledgerkeeper-probe"
	}
	// Belt and braces: every transaction on these connections is read-only
	// unless it says otherwise, and probes always say READ ONLY.
	rp["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, p.scrub(fmt.Errorf("sql probe: open pool: %w", err))
	}
	p.pool, p.ownsPool = pool, true
	return p, nil
}

// Close closes the pool the probe opened; a pool passed in SQLConfig.Pool
// belongs to the caller and stays open.
func (p *SQLProbe) Close() error {
	if p.ownsPool {
		p.pool.Close()
	}
	return nil
}

// Probe runs the query for k in a read-only transaction under the probe's
// timeout: 0 rows → NotFound, 1 → Found (the row as a JSON object), more →
// Duplicate, any error → Unknown.
func (p *SQLProbe) Probe(ctx context.Context, k Key) Result {
	args := make([]any, len(p.args))
	req := &requestDoc{raw: k.RequestBody}
	for i, ph := range p.args {
		v, err := ph.value(k, req)
		if err != nil {
			return unknown(nil, "sql probe: args[%d]: %w", i, err)
		}
		args[i] = v
	}

	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return unknown(nil, "sql probe: %s: %w", connectFailure(err), p.scrub(p.timeoutErr(ctx, err)))
	}
	// A connection left inside a transaction or broken is destroyed by
	// the pool on release, never reused.
	defer conn.Release()

	// The numbers come from a time.Duration, never from input. One round
	// trip: without arguments pgx sends this over the simple protocol.
	ms := max(p.timeout.Milliseconds(), 1)
	setup := fmt.Sprintf("BEGIN READ ONLY; SET LOCAL statement_timeout = %d; SET LOCAL lock_timeout = %d", ms, ms)
	if _, err := conn.Exec(ctx, setup); err != nil {
		return unknown(nil, "sql probe: begin read-only transaction: %w", p.scrub(p.timeoutErr(ctx, err)))
	}
	defer func() {
		// Bounded, and independent of ctx: a probe whose deadline passed
		// still ends its transaction if the connection survived.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer rcancel()
		_, _ = conn.Exec(rctx, "ROLLBACK")
	}()

	rows, n, err := p.run(ctx, conn, args)
	if err != nil {
		return unknown(nil, "sql probe: %w", p.scrub(p.timeoutErr(ctx, err)))
	}
	ev := json.RawMessage(fmt.Sprintf(`{"rows":%d}`, n))
	switch n {
	case 0:
		return Result{Verdict: NotFound, Evidence: ev}
	case 1:
		body, err := buildRowBody(rows, p.mapping)
		if err != nil {
			return unknown(ev, "sql probe: %w", err)
		}
		return Result{Verdict: Found, Outcome: &Outcome{Code: p.code, Body: body}, Evidence: ev}
	default:
		return Result{Verdict: Duplicate, Evidence: ev, Err: errors.New("sql probe: query returned more than one row")}
	}
}

// run executes the query and returns the first row as a decoded JSON object
// and the number of rows, counting no further than 2.
func (p *SQLProbe) run(ctx context.Context, conn *pgxpool.Conn, args []any) (map[string]any, int, error) {
	// The mode comes first and overrides the connection's default: a
	// caller's Pool configured for the simple protocol must not run a
	// second statement either.
	rows, err := conn.Query(ctx, p.query, append([]any{ProbeExecMode}, args...)...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	fds := rows.FieldDescriptions()
	var first map[string]any
	n := 0
	for rows.Next() {
		n++
		if n > 1 {
			break // a duplicate: how many does not matter
		}
		vals, err := rows.Values()
		if err != nil {
			return nil, 0, fmt.Errorf("decode row: %w", err)
		}
		if first, err = rowObject(fds, vals, rows.RawValues()); err != nil {
			return nil, 0, err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	// Zero rows is evidence of absence only from a SELECT: a statement
	// that returns no columns (COMMIT, SET…) proves nothing.
	if len(fds) == 0 || (n <= 1 && !rows.CommandTag().Select()) {
		return nil, 0, fmt.Errorf("the query is not a SELECT returning columns (command %q)", rows.CommandTag().String())
	}
	return first, n, nil
}

// timeoutErr names a probe timeout as one, whichever side noticed it.
func (p *SQLProbe) timeoutErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("no answer within %s: %w", p.timeout, err)
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch pgErr.Code {
		case "57014":
			return fmt.Errorf("statement timeout of %s: %w", p.timeout, err)
		case "55P03":
			return fmt.Errorf("lock timeout of %s (the rows are locked by another transaction): %w", p.timeout, err)
		case "25006":
			return fmt.Errorf("the query tried to write; probes are read-only: %w", err)
		}
	}
	return err
}

// scrubbedError replaces the message of an error that might quote the
// password, keeping the chain for errors.Is and errors.As.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrub removes the database password from err's message: drivers quote
// connection strings in places, and a password must never reach an audit
// row, a log or Slack.
func (p *SQLProbe) scrub(err error) error {
	if err == nil || p.secret == "" || !strings.Contains(err.Error(), p.secret) {
		return err
	}
	return &scrubbedError{msg: strings.ReplaceAll(err.Error(), p.secret, "xxxxx"), err: err}
}

// urlPassword extracts the password of a URL-style connection string, if it
// parses, so that it can be scrubbed even from a parse error.
func urlPassword(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return ""
	}
	pw, _ := u.User.Password()
	return pw
}

// JSON and JSONB type OIDs: their raw text is kept, so numbers inside stay
// exact (pgx would decode them into float64).
const (
	oidJSON  = 114
	oidJSONB = 3802
)

// rowObject renders a row as a decoded JSON object (column name → value),
// through encoding/json, so that its numbers are json.Number and mapping
// paths see what will be stored.
func rowObject(fds []pgconn.FieldDescription, vals []any, raws [][]byte) (map[string]any, error) {
	obj := make(map[string]any, len(fds))
	for i, fd := range fds {
		if _, dup := obj[fd.Name]; dup {
			return nil, fmt.Errorf("column %q appears twice in the result: give each column its own name (AS …)", fd.Name)
		}
		var v any
		var err error
		switch {
		case raws[i] == nil:
			v = nil
		case fd.DataTypeOID == oidJSON || fd.DataTypeOID == oidJSONB:
			raw := raws[i]
			if fd.DataTypeOID == oidJSONB && fd.Format == pgtype.BinaryFormatCode {
				if len(raw) == 0 || raw[0] != 1 {
					return nil, fmt.Errorf("column %q: unknown jsonb encoding", fd.Name)
				}
				raw = raw[1:]
			}
			v = json.RawMessage(raw)
		default:
			v, err = jsonValue(vals[i])
		}
		if err != nil {
			return nil, fmt.Errorf("column %q: %w", fd.Name, err)
		}
		obj[fd.Name] = v
	}
	enc, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode row as JSON: %w", err)
	}
	doc, err := decodeJSON(enc)
	if err != nil {
		return nil, fmt.Errorf("decode row JSON: %w", err)
	}
	return doc.(map[string]any), nil
}

// jsonValue converts a value decoded by pgx into one encoding/json renders
// sensibly: uuids as their text, NaN and infinities as strings, numerics
// exactly, intervals and other pgtype values as PostgreSQL's text. A type it
// does not know is an error rather than a guess: a stored outcome must not
// be Go's debug rendering of a struct.
func jsonValue(v any) (any, error) {
	switch x := v.(type) {
	case nil, bool, string, []byte, json.Number,
		int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return x, nil
	case float32:
		if f := float64(x); math.IsNaN(f) || math.IsInf(f, 0) {
			return floatName(f), nil
		}
		return x, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return floatName(x), nil
		}
		return x, nil
	case [16]byte: // uuid
		return fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16]), nil
	case pgtype.InfinityModifier:
		return x.String(), nil
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			var err error
			if out[i], err = jsonValue(el); err != nil {
				return nil, err
			}
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, el := range x {
			var err error
			if out[k], err = jsonValue(el); err != nil {
				return nil, err
			}
		}
		return out, nil
	case json.Marshaler, encoding.TextMarshaler: // time.Time, pgtype.Numeric, netip.Prefix…
		return x, nil
	case driver.Valuer: // pgtype.Interval, pgtype.Time, geometric types…
		dv, err := x.Value()
		if err != nil {
			return nil, err
		}
		if _, ok := dv.(driver.Valuer); ok {
			return nil, fmt.Errorf("value of type %T cannot be rendered as JSON: cast it in the query (e.g. col::text)", v)
		}
		return jsonValue(dv)
	default:
		return nil, fmt.Errorf("value of type %T cannot be rendered as JSON: cast it in the query (e.g. col::text)", v)
	}
}

func floatName(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case f > 0:
		return "Infinity"
	default:
		return "-Infinity"
	}
}

// buildRowBody renders the outcome body of a row: the whole row, or the
// mapped fields, each taken from the column of exactly that name if there is
// one, else from the JSON path into the row.
func buildRowBody(row map[string]any, mapping map[string]jsonPath) (json.RawMessage, error) {
	if len(mapping) == 0 {
		return buildBody(row, nil)
	}
	out := make(map[string]any, len(mapping))
	for _, field := range sortedKeys(mapping) {
		p := mapping[field]
		if v, ok := row[p.raw]; ok {
			out[field] = v
			continue
		}
		v, st := p.lookup(row)
		if st != present {
			return nil, fmt.Errorf("response_body field %q: no column or path %q in the row", field, p.raw)
		}
		out[field] = v
	}
	return buildBody(out, nil)
}

// CheckQuery refuses, with a clear message, a query that is empty or does
// not start with SELECT or WITH (after whitespace and comments). It is not
// what keeps a probe safe (the read-only transaction and PostgreSQL's
// refusal of several statements in a prepared one are); it turns a DELETE,
// a SHOW or a COMMIT into a configuration error instead of an unknown at
// every probe. NewSQL calls it, and config check (for the key's line).
func CheckQuery(query string) error {
	s := query
	for {
		s = strings.TrimLeft(s, " \t\n\r\f\v")
		switch {
		case strings.HasPrefix(s, "--"):
			if i := strings.IndexByte(s, '\n'); i >= 0 {
				s = s[i+1:]
			} else {
				s = ""
			}
			continue
		case strings.HasPrefix(s, "/*"):
			end := commentEnd(s)
			if end < 0 {
				return errors.New("query has an unterminated /* comment")
			}
			s = s[end:]
			continue
		}
		break
	}
	if s == "" || s[0] == ';' {
		return errors.New("query is empty: want one SELECT")
	}
	word := s
	if i := strings.IndexFunc(s, func(r rune) bool { return !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') }); i >= 0 { //nolint:staticcheck // QF1001: a character class reads best negated whole
		word = s[:i]
	}
	switch strings.ToUpper(word) {
	case "SELECT", "WITH":
		return nil
	}
	return fmt.Errorf("query starts with %.20q: a probe runs one SELECT (or WITH … SELECT) in a read-only transaction", word)
}

// commentEnd returns the index after the block comment opening s (block
// comments nest in PostgreSQL), or -1.
func commentEnd(s string) int {
	depth := 0
	for i := 0; i+1 < len(s); {
		switch {
		case s[i] == '/' && s[i+1] == '*':
			depth++
			i += 2
		case s[i] == '*' && s[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return -1
}

// SQLCheckError is a mistake in an sql probe's configuration that only the
// downstream can reveal, found by Check. Field is the probe's config key it
// concerns: "query", "args" or "response_body.FIELD".
type SQLCheckError struct {
	Field string
	Err   error
}

func (e *SQLCheckError) Error() string { return e.Err.Error() }
func (e *SQLCheckError) Unwrap() error { return e.Err }

// connectFailure says why a connection to the downstream failed: a server
// that answered and refused (a PostgreSQL error: an unknown role, a wrong
// password, a missing database) is told from one that could not be
// reached, so that an operator looks at the credentials, not the network.
func connectFailure(err error) string {
	if _, answered := errors.AsType[*pgconn.PgError](err); answered {
		return "the downstream database refused the connection (check the user, password and database name in database_url)"
	}
	return "cannot reach the downstream database (is it up? check database_url)"
}

// Check connects to the downstream and prepares the query there, without
// running it: PostgreSQL parses it (one statement), resolves its tables and
// columns and counts its parameters. The count must equal len(Args), and
// every response_body path must start at one of the result's columns (a
// column of exactly that name, or the first segment of a path into one).
// Such mistakes are returned as *SQLCheckError; any other error (the
// downstream cannot be reached, the pool is closed) is operational.
// `ledgerkeeper config check --connect` runs it for every sql probe.
func (p *SQLProbe) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("sql probe: %s: %w", connectFailure(err), p.scrub(p.timeoutErr(ctx, err)))
	}
	defer conn.Release()
	// An unnamed statement, replaced by the next Parse: nothing is left
	// behind on the downstream.
	sd, err := conn.Conn().Prepare(ctx, "", p.query)
	if err != nil {
		if _, ok := errors.AsType[*pgconn.PgError](err); ok {
			return &SQLCheckError{Field: "query", Err: fmt.Errorf("PostgreSQL refuses the query: %w", p.scrub(err))}
		}
		return fmt.Errorf("sql probe: prepare the query: %w", p.scrub(p.timeoutErr(ctx, err)))
	}
	if n := len(sd.ParamOIDs); n != len(p.args) {
		return &SQLCheckError{Field: "args", Err: fmt.Errorf("the query has %d parameter(s) ($1…$%d) but args has %d entries: each arg binds one parameter, in order", n, n, len(p.args))}
	}
	if len(sd.Fields) == 0 {
		return &SQLCheckError{Field: "query", Err: errors.New("the query returns no columns: a probe needs a SELECT whose row is the effect")}
	}
	cols := make([]string, 0, len(sd.Fields))
	seen := map[string]bool{}
	for _, f := range sd.Fields {
		if seen[f.Name] {
			return &SQLCheckError{Field: "query", Err: fmt.Errorf("column %q appears twice in the result: give each column its own name (AS …)", f.Name)}
		}
		seen[f.Name] = true
		cols = append(cols, f.Name)
	}
	for _, field := range sortedKeys(p.mapping) {
		path := p.mapping[field]
		if path.raw == "" || seen[path.raw] || seen[path.segs[0]] {
			continue
		}
		return &SQLCheckError{Field: "response_body." + field, Err: fmt.Errorf("no column %q among the query's result columns (%s)", path.segs[0], strings.Join(cols, ", "))}
	}
	return nil
}
