package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerkeeper/ledgerkeeper/internal/config"
	"github.com/ledgerkeeper/ledgerkeeper/internal/daemon"
	"github.com/ledgerkeeper/ledgerkeeper/internal/engine"
	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
	"github.com/ledgerkeeper/ledgerkeeper/ledger"
	"github.com/ledgerkeeper/ledgerkeeper/migrations"
	"github.com/ledgerkeeper/ledgerkeeper/probes"
	"github.com/ledgerkeeper/ledgerkeeper/store"
)

const (
	envDatabaseURL    = config.EnvDatabaseURL
	defaultConfigFile = "ledgerkeeper.yaml"
)

// app is what every command shares: flags, configuration, logger, pool.
type app struct {
	// stdout redacts every line a command prints (out is the same writer,
	// for writeJSON's documents and the final flush); stderr carries the
	// logger's records, redacted by its handler, and errors, redacted by
	// run.
	stdout, stderr io.Writer
	out            *secret.Writer
	// early redacts before the configuration is loaded (the
	// --database-url flag).
	early *secret.Redactor

	configPath  string
	databaseURL string
	logLevel    string
	ledgerName  string
	// manyLedgers: the command works on every ledger when --ledger is
	// absent (serve, migrate, status); the others need one.
	manyLedgers bool

	// all is the whole configuration; cfg is the selected ledger's (all
	// itself without a ledgers section, or when a command works on every
	// ledger and none was chosen).
	all    *config.Config
	cfg    *config.Config
	logger *slog.Logger
	probes *probes.Registry
}

// load reads the configuration (once) and sets up the logger.
func (a *app) load() error {
	if a.cfg != nil {
		return nil
	}
	path := a.configPath
	if path == "" {
		if _, err := os.Stat(defaultConfigFile); err == nil {
			path = defaultConfigFile
		}
	}
	var cfg *config.Config
	var err error
	if path == "" {
		cfg, err = config.Default(os.LookupEnv)
	} else {
		// LoadAll keeps going after structural errors, so that one run
		// reports them and the semantic ones together.
		cfg, err = config.LoadAll(path, os.LookupEnv)
	}
	if cfg != nil {
		// Defaults and validation are the services' (internal/config
		// only decodes).
		err = allConfigErrors(err, daemon.Settle(cfg))
		if err != nil {
			// Errors may quote the file's secrets: redact with its
			// redactor (the partial configuration's, on structural errors).
			a.early = cfg.Redactor()
		}
	}
	if err != nil {
		return &configError{err}
	}
	cfg.SetDatabaseURL(a.databaseURL)
	if a.logLevel != "" {
		cfg.Log.Level = a.logLevel
	}
	a.all, a.cfg = cfg, cfg
	if err := a.selectLedger(); err != nil {
		a.cfg = nil
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Log.Level)); err != nil {
		return usagef("--log-level: %v", err)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationsToTheMillisecond}
	var h slog.Handler = slog.NewTextHandler(a.stderr, opts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(a.stderr, &slog.HandlerOptions{Level: level, ReplaceAttr: durationsInSeconds})
	}
	a.logger = newLogger(h, cfg.Redactor())
	return nil
}

// selectLedger makes a.cfg the ledger of --ledger: required when the
// configuration has more than one and the command works on one.
func (a *app) selectLedger() error {
	all := a.all
	if a.ledgerName != "" {
		l, err := all.Ledger(a.ledgerName)
		if err != nil {
			return usagef("--ledger: %v", err)
		}
		a.cfg = l.Config
		return nil
	}
	if ls := all.Ledgers(); len(ls) == 1 {
		a.cfg = ls[0].Config
		return nil
	}
	if a.manyLedgers {
		return nil
	}
	return usagef("this configuration keeps %d ledgers (%s): choose one with --ledger NAME", len(all.Ledgers()), strings.Join(all.LedgerNames(), ", "))
}

// targets are the ledgers the command works on: the selected one, or every
// ledger when the command may work on all and none was chosen.
func (a *app) targets() []config.Ledger {
	if a.cfg != a.all || !a.all.Fleet() {
		name := a.ledgerLabel()
		if name == "" {
			name = config.DefaultLedger
		}
		return []config.Ledger{{Name: name, Config: a.cfg}}
	}
	return a.all.Ledgers()
}

// connectLedger connects to l's database, in its schema.
func connectLedger(ctx context.Context, l config.Ledger) (*ledgerDB, error) {
	raw := l.Database.URL.Reveal()
	if raw == "" {
		return nil, &configError{fmt.Errorf("ledger %s: no database: set its database_url (or database.url at the top level, $%s, or --database-url)", l.Name, envDatabaseURL)}
	}
	p, err := connect(ctx, raw, l.Database.MaxConns)
	if err != nil {
		return nil, err
	}
	return inLedger(p, l.Database.Schema), nil
}

// ledgerLabel names the selected ledger ("" when the command works on
// every ledger).
func (a *app) ledgerLabel() string {
	if a.ledgerName != "" {
		return a.ledgerName
	}
	if ls := a.all.Ledgers(); len(ls) == 1 {
		return ls[0].Name
	}
	return ""
}

// allConfigErrors is the file's structural errors and the semantic ones
// found on what could be decoded, in line order. A semantic error at (or
// under) a key that already has a structural error is left out: it is
// only that key's zero value speaking ("must be positive" after "bad
// duration").
func allConfigErrors(structural, semantic error) error {
	if structural == nil {
		return semantic
	}
	var st, se config.Errors
	if !errors.As(structural, &st) {
		return structural
	}
	if semantic != nil && !errors.As(semantic, &se) {
		return errors.Join(structural, semantic)
	}
	all := append(config.Errors{}, st...)
	for _, e := range se {
		shadowed := false
		for _, s := range st {
			if s.Path != "" && (e.Path == s.Path || strings.HasPrefix(e.Path, s.Path+".")) {
				shadowed = true
				break
			}
		}
		if !shadowed {
			all = append(all, e)
		}
	}
	all.SortByLine()
	return all
}

// newLogger is the one way a command gets a logger: every record is
// redacted by the configuration's redactor before h writes it.
func newLogger(h slog.Handler, r *secret.Redactor) *slog.Logger {
	return slog.New(secret.NewHandler(h, r))
}

// redactor is the configuration's redactor once loaded; before that, one
// that knows the --database-url flag.
func (a *app) redactor() *secret.Redactor {
	if a.cfg != nil {
		return a.cfg.Redactor()
	}
	if a.early == nil {
		a.early = secret.New()
	}
	a.early.Register(a.databaseURL)
	return a.early
}

// pool connects to the selected ledger's database and checks it answers.
func (a *app) pool(ctx context.Context) (*ledgerDB, error) {
	if err := a.load(); err != nil {
		return nil, err
	}
	raw := a.cfg.Database.URL.Reveal()
	if raw == "" {
		return nil, &configError{fmt.Errorf("no database: set database.url in the configuration, $%s, or --database-url", envDatabaseURL)}
	}
	p, err := connect(ctx, raw, a.cfg.Database.MaxConns)
	if err != nil {
		return nil, err
	}
	return inLedger(p, a.cfg.Database.Schema), nil
}

// ledgerDB is a ledger's database: a pool whose statements are qualified
// with the ledger's schema (none: they follow search_path).
type ledgerDB struct {
	store.Pool
	raw    *pgxpool.Pool
	schema string
}

// inLedger is raw in schema ("": raw itself).
func inLedger(raw *pgxpool.Pool, schema string) *ledgerDB {
	d := &ledgerDB{Pool: raw, raw: raw, schema: schema}
	if schema != "" {
		// The schema passed ledger.CheckSchema when the configuration
		// was settled.
		sd, err := ledger.InSchema(raw, schema)
		if err != nil {
			panic(err)
		}
		d.Pool = sd
	}
	return d
}

// Close closes the pool.
func (d *ledgerDB) Close() { d.raw.Close() }

// LedgerSchema is the ledger's schema: a connection taken out of the pool
// is qualified with it (ledger.SameSchema), and the advisory locks mix it
// in (ledger.LockKey).
func (d *ledgerDB) LedgerSchema() string { return d.schema }

// followingPool is pool with the hooks of the ledger.Follower that keeps it
// on the writable primary (serve watches it: internal/daemon.DatabaseHealth).
func (a *app) followingPool(ctx context.Context, opts ledger.FollowOptions) (*pgxpool.Pool, *ledger.Follower, error) {
	if err := a.load(); err != nil {
		return nil, nil, err
	}
	raw := a.cfg.Database.URL.Reveal()
	if raw == "" {
		return nil, nil, &configError{fmt.Errorf("no database: set database.url in the configuration, $%s, or --database-url", envDatabaseURL)}
	}
	return connectFollowing(ctx, raw, a.cfg.Database.MaxConns, opts)
}

// connect opens the pool every command works on. It follows the primary
// across failovers (ledger.FollowPrimary): a connection whose node turned
// read-only, went into recovery, shut down or broke is discarded with
// every other connection to that node, and the next ones go to the host of
// the URL that takes writes (several hosts: postgres://h1,h2/db with
// target_session_attrs=read-write, the default here when hosts are several).
func connect(ctx context.Context, raw string, maxConns int) (*pgxpool.Pool, error) {
	pool, _, err := connectFollowing(ctx, raw, maxConns, ledger.FollowOptions{})
	return pool, err
}

func connectFollowing(ctx context.Context, raw string, maxConns int, opts ledger.FollowOptions) (*pgxpool.Pool, *ledger.Follower, error) {
	pool, follower, err := openFollowing(ctx, raw, maxConns, opts)
	if err != nil {
		return nil, nil, err
	}
	if err := reach(ctx, pool); err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, follower, nil
}

// poolConfig parses a ledger database's URL into the pool's settings.
func poolConfig(raw string, maxConns int) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(raw)
	if err != nil {
		// pgx's parse errors may quote the URL: never repeat them.
		// Name it only when it is recognisably a URL or DSN (a value that is
		// neither could be a bare password pasted in the wrong place).
		shown := ""
		if r := redactURL(raw); r != unshownURL {
			shown = " " + r
		}
		return nil, &configError{fmt.Errorf("the database URL%s (database.url, $%s or --database-url) is not a valid PostgreSQL URL or DSN: expected postgres://USER@HOST:PORT/DBNAME (a password goes after USER and a colon) or host=… dbname=…", shown, envDatabaseURL)}
	}
	if maxConns > 0 {
		pc.MaxConns = int32(maxConns) //nolint:gosec // G115: database.max_conns has no upper bound check yet; a pool beyond int32 connections is not one anyone runs
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ledgerkeeper"
	// Our statements are index scans of small populations; PostgreSQL's
	// JIT, started on a cost estimate, only adds compile time to them (2.2 s
	// for a statement that then ran in 0.2 s: BENCHMARKS.md, "Big
	// ledgers"). A jit setting in the URL wins.
	if _, set := pc.ConnConfig.RuntimeParams["jit"]; !set {
		pc.ConnConfig.RuntimeParams["jit"] = "off"
	}
	return pc, nil
}

// openFollowing is connectFollowing without waiting for the database: the
// pool connects when first used. For a ledger of a serve that keeps
// several, whose database may be down when serve starts.
func openFollowing(ctx context.Context, raw string, maxConns int, opts ledger.FollowOptions) (*pgxpool.Pool, *ledger.Follower, error) {
	pc, err := poolConfig(raw, maxConns)
	if err != nil {
		return nil, nil, err
	}
	follower := ledger.FollowPrimary(pc, opts)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("database at %s: %w", redactURL(raw), err)
	}
	return pool, follower, nil
}

// openLedgerPool opens a fleet ledger's own pool on a database whose
// primary f already follows: a failover any pool of f sees, every pool
// leaves. Its sessions are named ledgerkeeper/LEDGER in pg_stat_activity.
func openLedgerPool(ctx context.Context, raw, ledgerName string, maxConns int, f *ledger.Follower) (*pgxpool.Pool, error) {
	pc, err := poolConfig(raw, maxConns)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ledgerkeeper/" + ledgerName
	f.Follow(pc)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("database at %s: %w", redactURL(raw), err)
	}
	return pool, nil
}

// reach checks that pool's database answers, within 10s, and has the
// store take its Citus shapes when it is a coordinator.
func reach(ctx context.Context, pool *pgxpool.Pool) error {
	pc := pool.Config()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		if refusedByServer(err) {
			return fmt.Errorf("database at %s:%d/%s refused the connection: %s: check the user, password and database name in database.url, $%s or --database-url",
				pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database, rootCause(err), envDatabaseURL)
		}
		return fmt.Errorf("cannot reach database at %s:%d/%s (%v): is PostgreSQL running? set database.url, $%s or --database-url",
			pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database, rootCause(err), envDatabaseURL)
	}
	// On a Citus coordinator the store takes its Citus shapes (package
	// internal/engine): once per process, from what it is connected to.
	citus, err := engine.Detect(pctx, pool)
	if err != nil {
		return fmt.Errorf("database at %s:%d/%s: %w", pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database, err)
	}
	engine.SetCitus(citus)
	return nil
}

// ledgerPool is pool for commands that work on the ledger: it also refuses
// a database whose schema is not current, with the command that fixes it.
func (a *app) ledgerPool(ctx context.Context) (*ledgerDB, error) {
	pool, err := a.pool(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, pool.raw, pool.schema); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// checkSchema refuses to work on a ledger that was never migrated.
func checkSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	st, err := migrations.ListIn(ctx, pool, schema)
	if err != nil {
		return err
	}
	var pending []string
	for _, s := range st {
		if !s.Applied {
			pending = append(pending, s.Name)
		}
	}
	if len(pending) > 0 {
		where := "the database schema is"
		if schema != "" {
			where = "the ledger's schema " + schema + " is"
		}
		return fmt.Errorf("%s not up to date (%d migration(s) pending: %v): run 'ledgerkeeper migrate'", where, len(pending), pending)
	}
	return nil
}

// rootCause names why a database connection failed, in one line. When the
// server refused the connection it says why (pgconn.PgError: "password
// authentication failed for user …", "database … does not exist"), and
// that is the cause even though pgx tried TLS first and its first
// attempt's error is "server refused TLS connection". Otherwise it is each
// attempt's own error (pgx joins one per address tried), duplicates
// dropped.
func rootCause(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		err = ce.Unwrap()
	} else {
		for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(err) {
			err = u
		}
	}
	var lines []string
	seen := map[string]bool{}
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// refusedByServer reports whether PostgreSQL itself answered and refused
// (wrong password, missing database or role), as opposed to not answering.
func refusedByServer(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}

// redactURL hides the password of a database URL, or of a DSN in
// key=value form, keeping the host readable (the output's redactor then
// removes any registered value left).
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && u.Host != "" {
		return secret.Patterns(u.Redacted())
	}
	if strings.Contains(raw, "=") {
		return secret.Patterns(raw)
	}
	return unshownURL
}

// unshownURL stands for a database URL redactURL cannot show safely.
const unshownURL = "the configured database"

// actor names who acts from the command line in the audit trail and run
// records: operator:NAME, NAME from --actor, else $USER, else the OS user,
// the same form for every command (reconcile, purge, hold, release,
// resolve, canaries), beside slack:<user id> and a replica's id.
func actor(flag string) string {
	name := flag
	if name == "" {
		name = os.Getenv("USER")
	}
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if name == "" {
		name = "unknown"
	}
	return "operator:" + strings.TrimPrefix(name, "operator:")
}

// writeJSON prints one JSON document on stdout, every string in it
// redacted (numbers and structure untouched, so it stays one valid
// document).
func (a *app) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, a.redactor().JSON(b), "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	w := a.stdout
	if a.out != nil {
		if err := a.out.Flush(); err != nil {
			return err
		}
		w = a.out.Raw()
	}
	_, err = w.Write(buf.Bytes())
	return err
}
