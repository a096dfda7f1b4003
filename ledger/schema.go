package ledger

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tables are the ledger's tables: idempotency_keys and the daemon's
// bookkeeping beside it. InSchema qualifies each of them, and nothing else,
// with the ledger's schema.
var Tables = []string{
	"idempotency_keys",
	"reconcile_state",
	"key_holds",
	"reconcile_audit",
	"tool_breakers",
	"alert_outbox",
	"alert_state",
	"ledgerkeeper_runs",
	"probe_self_checks",
	"slack_seen",
	"probe_canaries",
	"stuck_samples",
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CheckSchema says what is wrong with a schema name, or nil. A ledger's
// schema is a plain lower-case identifier (letters, digits, underscores; at
// most 63 bytes), not one of PostgreSQL's own (pg_*, information_schema):
// it is written into statements as a quoted identifier, and a name that
// would need quoting to mean what it says is refused rather than guessed at.
func CheckSchema(name string) error {
	switch {
	case name == "":
		return errors.New("schema name is empty")
	case !schemaName.MatchString(name):
		return fmt.Errorf("schema %q: use lower-case letters, digits and underscores, starting with a letter or underscore, at most 63 bytes", name)
	case strings.HasPrefix(name, "pg_") || name == "information_schema":
		return fmt.Errorf("schema %q is reserved by PostgreSQL", name)
	}
	return nil
}

// SchemaDB runs statements with every ledger table qualified by one schema
// ("billing".idempotency_keys): the schema is in each statement, never in
// search_path, so it holds behind a transaction-mode pooler (PgBouncer),
// where a session setting would leak between clients or be lost. It wraps a
// pool, a connection or a transaction; Begin returns a transaction that
// qualifies too, and SendBatch qualifies every queued statement.
//
// Statements are rewritten outside string literals, quoted identifiers,
// comments and dollar-quoted bodies; an identifier already qualified
// (x.idempotency_keys) is left alone, so rewriting twice changes nothing.
// One literal form is qualified as well: a ledger table's name cast to
// regclass ('idempotency_keys'::regclass), so catalog reads address the
// ledger's own table.
type SchemaDB struct {
	db DBTX
	q  *qualifier
}

// InSchema returns db with every statement qualified by schema (see
// SchemaDB). The schema must pass CheckSchema; it need not exist yet
// (migrations create it).
func InSchema(db DBTX, schema string) (*SchemaDB, error) {
	if err := CheckSchema(schema); err != nil {
		return nil, err
	}
	return &SchemaDB{db: db, q: qualifiers.get(schema)}, nil
}

// SchemaOf is the schema db qualifies its statements with, "" for a db
// that is not a SchemaDB (its statements follow search_path).
func SchemaOf(db any) string {
	if s, ok := db.(interface{ LedgerSchema() string }); ok {
		return s.LedgerSchema()
	}
	return ""
}

// SameSchema returns conn qualified like like: conn itself when like is not
// in a schema. For a connection taken out of a SchemaDB's pool (Acquire),
// whose own methods do not qualify.
func SameSchema(like any, conn DBTX) DBTX {
	s := SchemaOf(like)
	if s == "" {
		return conn
	}
	if sd, ok := conn.(*SchemaDB); ok && sd.q.schema == s {
		return conn
	}
	return &SchemaDB{db: conn, q: qualifiers.get(s)}
}

// LockKey is an advisory lock key for db's ledger: base itself outside a
// schema (so a single-ledger deployment keeps the lock it always took), and
// base mixed with the schema's name inside one, so ledgers in one database
// do not serialise each other's purges or migrations.
func LockKey(db any, base int64) int64 { return SchemaLockKey(SchemaOf(db), base) }

// SchemaLockKey is LockKey for the ledger in schema s ("": the default).
func SchemaLockKey(s string, base int64) int64 {
	if s == "" {
		return base
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return base ^ int64(h.Sum64()&0x7fffffffffffffff) //nolint:gosec // a hash folded to 63 bits: no overflow
}

// LedgerSchema names the schema.
func (s *SchemaDB) LedgerSchema() string { return s.q.schema }

// Unwrap is the database s qualifies statements for.
func (s *SchemaDB) Unwrap() DBTX { return s.db }

// Exec runs sql qualified.
func (s *SchemaDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.db.Exec(ctx, s.q.rewrite(sql), args...)
}

// Query runs sql qualified.
func (s *SchemaDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.db.Query(ctx, s.q.rewrite(sql), args...)
}

// QueryRow runs sql qualified.
func (s *SchemaDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.db.QueryRow(ctx, s.q.rewrite(sql), args...)
}

// Begin starts a transaction whose statements are qualified too. The
// wrapped database must be able to begin one (a pool, a connection, or a
// transaction: a savepoint).
func (s *SchemaDB) Begin(ctx context.Context) (pgx.Tx, error) {
	b, ok := s.db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, fmt.Errorf("ledger in schema %s: %T cannot begin a transaction", s.q.schema, s.db)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &schemaTx{Tx: tx, q: s.q}, nil
}

// BeginTx starts a transaction with options; its statements are qualified.
func (s *SchemaDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	b, ok := s.db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	})
	if !ok {
		return nil, fmt.Errorf("ledger in schema %s: %T cannot begin a transaction with options", s.q.schema, s.db)
	}
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &schemaTx{Tx: tx, q: s.q}, nil
}

// SendBatch sends b with every statement qualified (b itself is left as it
// was).
func (s *SchemaDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	sender, ok := s.db.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	})
	if !ok {
		return errBatch{err: fmt.Errorf("ledger in schema %s: %T cannot send a batch", s.q.schema, s.db)}
	}
	return sender.SendBatch(ctx, s.q.batch(b))
}

// Acquire takes a connection out of the wrapped pool. The connection is the
// pool's own and does not qualify: use it through SameSchema(s, conn).
func (s *SchemaDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	p, ok := s.db.(interface {
		Acquire(context.Context) (*pgxpool.Conn, error)
	})
	if !ok {
		return nil, fmt.Errorf("ledger in schema %s: %T is not a pool", s.q.schema, s.db)
	}
	return p.Acquire(ctx)
}

// schemaTx is a transaction of a SchemaDB: every statement qualified.
type schemaTx struct {
	pgx.Tx
	q *qualifier
}

func (t *schemaTx) LedgerSchema() string { return t.q.schema }

func (t *schemaTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.Tx.Exec(ctx, t.q.rewrite(sql), args...)
}

func (t *schemaTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.Tx.Query(ctx, t.q.rewrite(sql), args...)
}

func (t *schemaTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.Tx.QueryRow(ctx, t.q.rewrite(sql), args...)
}

func (t *schemaTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.Tx.SendBatch(ctx, t.q.batch(b))
}

func (t *schemaTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.Tx.Prepare(ctx, name, t.q.rewrite(sql))
}

func (t *schemaTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if len(table) == 1 && t.q.tables[table[0]] {
		table = pgx.Identifier{t.q.schema, table[0]}
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

func (t *schemaTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &schemaTx{Tx: tx, q: t.q}, nil
}

// errBatch is the results of a batch that could not be sent; its methods
// other than these four are the nil interface's.
type errBatch struct {
	pgx.BatchResults
	err error
}

func (e errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, e.err }
func (e errBatch) Query() (pgx.Rows, error)         { return nil, e.err }
func (e errBatch) QueryRow() pgx.Row                { return errRow{e.err} }
func (e errBatch) Close() error                     { return e.err }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// qualifier rewrites statements for one schema, remembering the rewrites of
// the statements it has seen (the same few constants, over and over).
type qualifier struct {
	schema string
	prefix string // `"schema".`
	tables map[string]bool
	cache  sync.Map // sql → rewritten sql
	cached int64    // entries in cache, bounded by maxCached
	mu     sync.Mutex
}

// maxCached bounds a qualifier's cache: statements built at run time (a
// filter's WHERE) are rewritten each time once it is full.
const maxCached = 4096

// qualifiers shares one qualifier (and its cache) per schema.
var qualifiers = qualifierSet{m: map[string]*qualifier{}}

type qualifierSet struct {
	mu sync.Mutex
	m  map[string]*qualifier
}

func (qs *qualifierSet) get(schema string) *qualifier {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q, ok := qs.m[schema]; ok {
		return q
	}
	q := &qualifier{schema: schema, prefix: quoteIdent(schema) + ".", tables: map[string]bool{}}
	for _, t := range Tables {
		q.tables[t] = true
	}
	qs.m[schema] = q
	return q
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (q *qualifier) batch(b *pgx.Batch) *pgx.Batch {
	out := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, len(b.QueuedQueries))}
	for i, qq := range b.QueuedQueries {
		c := *qq
		c.SQL = q.rewrite(qq.SQL)
		out.QueuedQueries[i] = &c
	}
	return out
}

func (q *qualifier) rewrite(sql string) string {
	if v, ok := q.cache.Load(sql); ok {
		return v.(string)
	}
	out := QualifySQL(q.prefix, q.tables, sql)
	q.mu.Lock()
	if q.cached < maxCached {
		q.cached++
		q.cache.Store(sql, out)
	}
	q.mu.Unlock()
	return out
}

// QualifySQL returns sql with every bare identifier in tables prefixed by
// prefix (`"schema".`), outside string literals, quoted identifiers,
// comments and dollar-quoted bodies; a literal naming a table and cast to
// regclass ('t'::regclass) is qualified inside the quotes. An identifier
// after a dot is already qualified and left alone. Exported for the
// migrations, which rewrite their files with it.
func QualifySQL(prefix string, tables map[string]bool, sql string) string {
	var b strings.Builder
	b.Grow(len(sql) + 64)
	n := len(sql)
	last := byte(0) // the last byte outside whitespace and comments
	for i := 0; i < n; {
		c := sql[i]
		switch {
		case c == '-' && i+1 < n && sql[i+1] == '-':
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				j = n - i
			}
			b.WriteString(sql[i : i+j])
			i += j
		case c == '/' && i+1 < n && sql[i+1] == '*':
			j := blockCommentEnd(sql, i)
			b.WriteString(sql[i:j])
			i = j
		case c == '\'':
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i < 2 || !isIdentByte(sql[i-2]))
			j := stringEnd(sql, i, escapes)
			lit := sql[i:j]
			if name := lit[1 : len(lit)-1]; len(lit) >= 2 && tables[name] && strings.HasPrefix(strings.ToLower(sql[j:]), "::regclass") {
				lit = "'" + strings.ReplaceAll(prefix, "'", "''") + name + "'"
			}
			b.WriteString(lit)
			i = j
			last = '\''
		case c == '"':
			j := quotedEnd(sql, i)
			b.WriteString(sql[i:j])
			i = j
			last = '"'
		case c == '$' && i+1 < n && !isDigit(sql[i+1]) && (i == 0 || !isIdentByte(sql[i-1])):
			if j, ok := dollarEnd(sql, i); ok {
				b.WriteString(sql[i:j])
				i = j
				last = '$'
				continue
			}
			b.WriteByte(c)
			i++
			last = c
		case isIdentStart(c):
			j := i + 1
			for j < n && isIdentByte(sql[j]) {
				j++
			}
			word := sql[i:j]
			if last != '.' && tables[strings.ToLower(word)] {
				b.WriteString(prefix)
			}
			b.WriteString(word)
			i = j
			last = 'a'
		default:
			b.WriteByte(c)
			if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				last = c
			}
			i++
		}
	}
	return b.String()
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z') || c >= 0x80 }
func isIdentByte(c byte) bool  { return isIdentStart(c) || isDigit(c) || c == '$' }

// stringEnd is the index after the literal starting at sql[i] == '\”:
// ” is a quote inside it, and with escapes (E'...') so is \'.
func stringEnd(sql string, i int, escapes bool) int {
	for j := i + 1; j < len(sql); j++ {
		switch sql[j] {
		case '\\':
			if escapes {
				j++
			}
		case '\'':
			if j+1 < len(sql) && sql[j+1] == '\'' {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(sql)
}

// quotedEnd is the index after the quoted identifier at sql[i] == '"'.
func quotedEnd(sql string, i int) int {
	for j := i + 1; j < len(sql); j++ {
		if sql[j] == '"' {
			if j+1 < len(sql) && sql[j+1] == '"' {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(sql)
}

// blockCommentEnd is the index after the comment at sql[i:] == "/*";
// PostgreSQL's block comments nest.
func blockCommentEnd(sql string, i int) int {
	depth := 0
	for j := i; j+1 < len(sql); j++ {
		switch {
		case sql[j] == '/' && sql[j+1] == '*':
			depth++
			j++
		case sql[j] == '*' && sql[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(sql)
}

// dollarEnd is the index after the dollar-quoted string at sql[i] == '$'
// ($$...$$ or $tag$...$tag$), and false if sql[i] starts none.
func dollarEnd(sql string, i int) (int, bool) {
	j := i + 1
	for j < len(sql) && sql[j] != '$' {
		if !isIdentByte(sql[j]) || sql[j] == '$' {
			return 0, false
		}
		j++
	}
	if j >= len(sql) {
		return 0, false
	}
	tag := sql[i : j+1]
	end := strings.Index(sql[j+1:], tag)
	if end < 0 {
		return len(sql), true
	}
	return j + 1 + end + len(tag), true
}
