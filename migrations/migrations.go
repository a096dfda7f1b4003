// Package migrations holds ledgerkeeper's schema as SQL files embedded into
// the binary and the code that applies them with goose.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/ledgerkeeper/ledgerkeeper/ledger"
)

//go:embed *.sql
var files embed.FS

// lockID is the advisory lock that serialises migrations across replicas
// starting at once (an arbitrary constant: "ledgerkp" in ASCII).
const lockID int64 = 0x6c65646765726b70

// VersionTable is goose's bookkeeping table.
const VersionTable = "ledgerkeeper_schema_migrations"

// Status is one migration and whether it is applied.
type Status struct {
	Version int64  `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

func provider(pool *pgxpool.Pool, logger *slog.Logger, schema string) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(ledger.SchemaLockKey(schema, lockID)))
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migration lock: %w", err)
	}
	var sub fs.FS = files
	table := VersionTable
	if schema != "" {
		// Each schema keeps its own history, its files' statements
		// qualified with it (the name passed ledger.CheckSchema: a plain
		// identifier, as goose's own catalog query needs it).
		sub = qualifiedFS{files: files, schema: schema}
		table = schema + "." + VersionTable
	}
	opts := []goose.ProviderOption{
		goose.WithSessionLocker(locker),
		goose.WithTableName(table),
		goose.WithDisableGlobalRegistry(true),
	}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, opts...)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migrations: %w", err)
	}
	return p, db, nil
}

// Up applies every pending migration and returns the versions it applied. It
// is safe to run from several processes at once: a session advisory lock
// serialises them, and a second run applies nothing. On a Citus
// coordinator (the citus extension is installed) it then lays the tables
// out (Distribute).
func Up(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) ([]Status, error) {
	r, err := Apply(ctx, pool, Options{Logger: logger})
	return r.Applied, err
}

// Options tune Apply.
type Options struct {
	Logger *slog.Logger
	// Distributed requires a Citus coordinator: without the citus
	// extension Apply fails instead of leaving a plain PostgreSQL schema.
	Distributed bool
	// Schema is the ledger's schema ("": the tables follow search_path, as
	// a single-ledger deployment always had them). It is created if
	// missing, gets its own migration history (SCHEMA.ledgerkeeper_schema_migrations)
	// and its own migration lock, and every statement of the migrations is
	// qualified with it.
	Schema string
}

// Result is what Apply did.
type Result struct {
	// Applied are the migrations applied now.
	Applied []Status `json:"applied"`
	// Citus says whether the database is a Citus coordinator.
	Citus bool `json:"citus"`
	// Distributed are the tables given their Citus shape now.
	Distributed []Placement `json:"distributed,omitempty"`
}

// Apply applies every pending migration and, on Citus, the layout step.
func Apply(ctx context.Context, pool *pgxpool.Pool, opts Options) (Result, error) {
	var r Result
	citus, err := IsCitus(ctx, pool)
	if err != nil {
		return r, err
	}
	if opts.Distributed && !citus {
		return r, errors.New("--distributed: the database has no citus extension; " +
			"connect to a Citus coordinator (CREATE EXTENSION citus there, and on every worker) or leave --distributed off")
	}
	if opts.Schema != "" {
		if err := ledger.CheckSchema(opts.Schema); err != nil {
			return r, err
		}
		if citus {
			return r, fmt.Errorf("schema %s: a ledger in its own schema on a Citus coordinator is not supported yet; keep a distributed ledger in the default schema", opts.Schema)
		}
		if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{opts.Schema}.Sanitize()); err != nil {
			return r, fmt.Errorf("create schema %s: %w", opts.Schema, err)
		}
	}
	p, db, err := provider(pool, opts.Logger, opts.Schema)
	if err != nil {
		return r, err
	}
	defer db.Close()
	results, err := p.Up(ctx)
	if err != nil {
		var partial *goose.PartialError
		if errors.As(err, &partial) && partial.Failed != nil {
			return r, fmt.Errorf("apply migration %s: %w", partial.Failed.Source.Path, partial.Err)
		}
		return r, fmt.Errorf("apply migrations: %w", err)
	}
	r.Applied = make([]Status, 0, len(results))
	for _, res := range results {
		r.Applied = append(r.Applied, Status{Version: res.Source.Version, Name: res.Source.Path, Applied: true})
	}
	r.Citus = citus
	if citus {
		r.Distributed, err = Distribute(ctx, pool, opts.Logger)
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// List reports every known migration and whether it is applied.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Status, error) {
	return ListIn(ctx, pool, "")
}

// ListIn is List for the ledger in schema ("": the default). A schema that
// does not exist has every migration pending.
func ListIn(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Status, error) {
	if schema != "" {
		if err := ledger.CheckSchema(schema); err != nil {
			return nil, err
		}
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
			return nil, fmt.Errorf("migration status: %w", err)
		}
		if !exists {
			return pendingAll()
		}
	}
	p, db, err := provider(pool, nil, schema)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]Status, 0, len(st))
	for _, s := range st {
		out = append(out, Status{Version: s.Source.Version, Name: s.Source.Path, Applied: s.State == goose.StateApplied})
	}
	return out, nil
}

// pendingAll is every migration, none applied.
func pendingAll() ([]Status, error) {
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(names))
	for _, n := range names {
		v, err := goose.NumericComponent(n)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", n, err)
		}
		out = append(out, Status{Version: v, Name: n})
	}
	return out, nil
}

// qualifiedFS is the migrations with every ledger table in their
// statements qualified by schema (ledger.QualifySQL).
type qualifiedFS struct {
	files  embed.FS
	schema string
}

func (q qualifiedFS) Open(name string) (fs.File, error) {
	f, err := q.files.Open(name)
	if err != nil || !strings.HasSuffix(name, ".sql") {
		return f, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	tables := make(map[string]bool, len(ledger.Tables))
	for _, t := range ledger.Tables {
		tables[t] = true
	}
	text := ledger.QualifySQL(pgx.Identifier{q.schema}.Sanitize()+".", tables, string(b))
	return &memFile{Reader: strings.NewReader(text), info: info, size: int64(len(text))}, nil
}

// ReadDir lists the embedded files (goose globs them).
func (q qualifiedFS) ReadDir(name string) ([]fs.DirEntry, error) { return q.files.ReadDir(name) }

// memFile is a rewritten migration file.
type memFile struct {
	*strings.Reader
	info fs.FileInfo
	size int64
}

func (m *memFile) Stat() (fs.FileInfo, error) { return sizedInfo{m.info, m.size}, nil }
func (m *memFile) Close() error               { return nil }

type sizedInfo struct {
	fs.FileInfo
	size int64
}

func (s sizedInfo) Size() int64 { return s.size }
