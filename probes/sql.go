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
	// unknown, not NewSQL fail.
	DatabaseURL string
	// Query is one SELECT with parameters $1…$n bound from Args, e.g.
	// "SELECT id AS charge_id, amount_cents FROM charges WHERE
	// idempotency_key = $1". One trailing ';' is allowed; a second
	// statement is refused.
	Query string
	// Args are the parameters' sources, in order: "key", "tool" or
	// "request.PATH" (a dotted path into the key's request body). Every
	// $1…$n must be used and n must equal len(Args).
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

// NewSQL validates cfg and returns an sql probe. It refuses a query that is
// more than one statement or whose parameters do not match Args. It does
// not connect: ctx only bounds setting the pool up.
func NewSQL(ctx context.Context, cfg SQLConfig) (*SQLProbe, error) {
	shape, err := scanSQL(cfg.Query)
	if err != nil {
		return nil, fmt.Errorf("sql probe: %w", err)
	}
	for n := 1; n <= max(shape.maxParam, len(cfg.Args)); n++ {
		if !shape.params[n] {
			return nil, fmt.Errorf("sql probe: query does not use $%d, but args has %d entries: each arg binds one parameter, $1 to $%d", n, len(cfg.Args), len(cfg.Args))
		}
	}
	if shape.maxParam != len(cfg.Args) {
		return nil, fmt.Errorf("sql probe: query uses parameters up to $%d but args has %d entries", shape.maxParam, len(cfg.Args))
	}
	p := &SQLProbe{
		query:   shape.body,
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
	pcfg.MaxConns = int32(cmp.Or(cfg.MaxConns, DefaultMaxConns))
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
		return unknown(nil, "sql probe: cannot reach the downstream database (is it up? check database_url): %w", p.scrub(p.timeoutErr(ctx, err)))
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
	rows, err := conn.Query(ctx, p.query, args...)
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
