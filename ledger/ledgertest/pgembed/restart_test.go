package pgembed

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A restart keeps the data and the port, starts a new postmaster (a new
// start time) and runs whileDown while no server is up.
func TestRestartKeepsTheDataAndStartsANewPostmaster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE kept AS SELECT 42 AS v`); err != nil {
		t.Fatal(err)
	}
	var before time.Time
	if err := conn.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)

	var sawDown bool
	err = s.Restart(ctx, func(dataDir string) error {
		c, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			_ = c.Close(ctx)
		}
		sawDown = err != nil && dataDir != ""
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !sawDown {
		t.Error("whileDown ran while the server still accepted connections (or without the data directory)")
	}
	conn, err = pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	var after time.Time
	if err := conn.QueryRow(ctx, `SELECT v, pg_postmaster_start_time() FROM kept`).Scan(&v, &after); err != nil {
		t.Fatal(err)
	}
	if v != 42 || !after.After(before) {
		t.Errorf("after the restart: v %d (want 42), start time %s (before %s)", v, after, before)
	}
}
