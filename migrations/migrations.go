// Package migrations holds ledgerkeeper's schema as SQL files embedded into
// the binary and the code that applies them with goose.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
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

func provider(pool *pgxpool.Pool, logger *slog.Logger) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID))
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migration lock: %w", err)
	}
	sub, err := fs.Sub(files, ".")
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	opts := []goose.ProviderOption{
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
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
	p, db, err := provider(pool, opts.Logger)
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
	p, db, err := provider(pool, nil)
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
