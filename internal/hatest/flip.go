package hatest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
)

// Pair is a primary and its synchronous streaming standby, for a role flip
// in which the old primary's sockets stay open: Flip turns the primary
// read-only (default_transaction_read_only = on, a configuration reload:
// every open session included) and promotes the standby.
type Pair struct {
	// Ports: the primary's, then the standby's.
	Ports [2]int

	primary *pgembed.Server
	e       *env
	standby *proc
}

// StartPair starts a primary (pgembed) and a standby streaming from it
// (pg_basebackup -R).
func StartPair(ctx context.Context) (*Pair, error) {
	// synchronous_commit on (pgembed's default is off): a commit waits for
	// the synchronous standby (see synchronous).
	primary, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, Install)
	}
	e, err := newEnv()
	if err != nil {
		primary.Stop()
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		primary.Stop()
		return nil, err
	}
	p := &Pair{Ports: [2]int{primary.Port, ports[0]}, primary: primary, e: e}
	data := filepath.Join(e.dir, "standby")
	if _, err := e.run(ctx, filepath.Join(e.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-D", data, "-R", "-X", "stream", "--no-sync"); err != nil {
		p.Stop()
		return nil, err
	}
	p.standby, err = e.start("standby.log", filepath.Join(e.bin, "postgres"), "-D", data, "-p", strconv.Itoa(p.Ports[1]),
		"-k", e.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "hot_standby=on",
		// A hot standby needs at least the primary's max_connections
		// (pgembed's: 400).
		"-c", "max_connections=400")
	if err != nil {
		p.Stop()
		return nil, err
	}
	if err := poll(ctx, 100*time.Millisecond, "the standby to accept connections", func() bool {
		var rec bool
		return query(ctx, nodeURL(p.Ports[1], "postgres"), "SELECT pg_is_in_recovery()", &rec) == nil && rec
	}); err != nil {
		err = fmt.Errorf("%w: %s", err, p.standby.tail())
		p.Stop()
		return nil, err
	}
	if err := p.synchronous(ctx); err != nil {
		err = fmt.Errorf("%w: %s", err, p.standby.tail())
		p.Stop()
		return nil, err
	}
	return p, nil
}

// synchronous makes the primary acknowledge a commit only once the standby
// has flushed it (synchronous_standby_names = '*', synchronous_commit on),
// and waits until the standby is the synchronous one. This is what makes
// the flip lose no acknowledged write whatever the old primary's sessions
// do: one that commits after the standby is promoted (a transaction begun
// before the read-only reload, or a session the reload reached late) waits
// for an acknowledgement that never comes, and its client is never told
// it committed. Without it the flip raced such a commit (an acknowledged
// call's row missing on the new primary).
func (p *Pair) synchronous(ctx context.Context) error {
	primary := nodeURL(p.Ports[0], "postgres")
	if err := query(ctx, primary, "ALTER SYSTEM SET synchronous_standby_names = '*'"); err != nil {
		return err
	}
	if err := query(ctx, primary, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	return poll(ctx, 50*time.Millisecond, "the standby to replicate synchronously", func() bool {
		var n int
		return query(ctx, primary, "SELECT count(*)::int FROM pg_stat_replication WHERE sync_state = 'sync'", &n) == nil && n == 1
	})
}

// URL is the pair's URL for database db: both hosts, read-write.
func (p *Pair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.Ports[0], p.Ports[1], db)
}

// PrimaryURL is the primary's database db alone.
func (p *Pair) PrimaryURL(db string) string { return nodeURL(p.Ports[0], db) }

// WaitReplayed waits until the standby has replayed everything the
// primary wrote so far (so a database created there is there too).
func (p *Pair) WaitReplayed(ctx context.Context) error {
	var lsn string
	if err := query(ctx, nodeURL(p.Ports[0], "postgres"), "SELECT pg_current_wal_lsn()::text", &lsn); err != nil {
		return err
	}
	return poll(ctx, 50*time.Millisecond, "the standby to replay "+lsn, func() bool {
		var ok bool
		return query(ctx, nodeURL(p.Ports[1], "postgres"), "SELECT pg_last_wal_replay_lsn() >= '"+lsn+"'::pg_lsn", &ok) == nil && ok
	})
}

// Flip turns the primary read-only in place, waits until the standby has
// replayed all it wrote, and promotes the standby. No acknowledged write
// is lost, as with Aurora's shared storage: replication is synchronous
// (see synchronous), so a commit the old primary takes after the promotion
// is never acknowledged. It returns once the standby takes writes.
func (p *Pair) Flip(ctx context.Context) error {
	old := nodeURL(p.Ports[0], "postgres")
	if err := query(ctx, old, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		return err
	}
	if err := query(ctx, old, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	// A session takes the reload in between two statements: wait until
	// the primary's WAL stops moving and the standby has all of it.
	if err := poll(ctx, 50*time.Millisecond, "the read-only primary's WAL replayed", func() bool {
		var before string
		if query(ctx, old, "SELECT pg_current_wal_lsn()::text", &before) != nil || p.WaitReplayed(ctx) != nil {
			return false
		}
		var after string
		return query(ctx, old, "SELECT pg_current_wal_lsn()::text", &after) == nil && after == before
	}); err != nil {
		return err
	}
	var promoted bool
	if err := query(ctx, nodeURL(p.Ports[1], "postgres"), "SELECT pg_promote(true, 30)", &promoted); err != nil {
		return fmt.Errorf("promote the standby: %w", err)
	}
	if !promoted {
		return errors.New("promote the standby: pg_promote returned false")
	}
	return poll(ctx, 50*time.Millisecond, "the promoted standby to take writes", func() bool {
		var ro string
		return query(ctx, nodeURL(p.Ports[1], "postgres"), "SHOW transaction_read_only", &ro) == nil && ro == "off"
	})
}

// Stop stops both and removes their directories.
func (p *Pair) Stop() {
	if p == nil {
		return
	}
	p.standby.stop(10 * time.Second)
	p.primary.Stop()
	if p.e != nil {
		_ = removeAll(p.e.dir)
	}
}

// StartFlipPair is StartPair for a test, stopped when it ends.
func StartFlipPair(t testing.TB) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := StartPair(ctx)
	if err != nil {
		t.Fatalf("hatest: start a primary and its standby: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}
