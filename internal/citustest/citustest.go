// Package citustest runs a throwaway Citus cluster for the tests: a
// coordinator and two workers on loopback, each a PostgreSQL 15 server
// loading the Citus extension, built once from source
// (../shared/citus/build.sh) into a cache directory and reused afterwards.
//
// internal/pgtest starts one when LEDGERKEEPER_TEST_ENGINE=citus, so a test
// package's suite runs unchanged against a distributed ledger. A missing
// build dependency or a failed build is an error that says what to install:
// the tests are never skipped.
//
// Databases are per test, as with plain PostgreSQL: Citus keeps its
// metadata (the nodes, the shards) per database, and a worker holds a
// distributed table's shards in the database of the coordinator's name. So
// a database is made on every node (CreateDatabase), workers first, and a
// test database is a copy of one prepared template on every node at once:
// the copies' metadata names the same shards, which every node copied too.
package citustest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvBuildScript names the variable that points at Citus's build script
// when it is not at ../shared/citus/build.sh beside the repository.
const EnvBuildScript = "LEDGERKEEPER_CITUS_BUILD"

// EnvCacheDir names the variable that sets where builds go, one directory
// per Citus and PostgreSQL release (default: /var/cache/ledgerkeeper as root, else the
// user's cache directory's ledgerkeeper/). The servers' user (postgres,
// when the tests run as root) must be able to read and run what is there.
const EnvCacheDir = "LEDGERKEEPER_CITUS_DIR"

// Workers is the number of worker nodes Start runs.
const Workers = 2

// ShardCount is the test clusters' citus.shard_count.
const ShardCount = 4

// BuildScript returns the path of Citus's build script: $LEDGERKEEPER_CITUS_BUILD,
// else ../shared/citus/build.sh relative to the repository's root.
func BuildScript() (string, error) {
	if p := os.Getenv(EnvBuildScript); p != "" {
		return p, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("citustest: cannot locate the repository (runtime.Caller); set " + EnvBuildScript)
	}
	// file is <repo>/internal/citustest/citustest.go.
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	p := filepath.Join(filepath.Dir(root), "shared", "citus", "build.sh")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("citustest: no Citus build script at %s (set %s to its path): %w", p, EnvBuildScript, err)
	}
	return p, nil
}

// Build builds Citus with the build script into the cache directory, or
// reuses the build already there, and returns the directory of the server
// programs (postgres, pg_ctl, initdb) that load it. Several test binaries
// building at once take turns (a file lock); the script itself returns at
// once when its output is complete.
func Build(ctx context.Context) (string, error) {
	script, err := BuildScript()
	if err != nil {
		return "", err
	}
	// One build per source tarball and PostgreSQL release: citus-13.2.2.tar.gz
	// against PostgreSQL 15.20 builds into <cache>/citus-13.2.2-pg15.20.
	// The build copies the server's programs and links its libraries, so a
	// build kept across an upgrade of the server (apt-get upgrading
	// postgresql-15) would pair old programs with new libraries.
	tarballs, _ := filepath.Glob(filepath.Join(filepath.Dir(script), "citus-*.tar.gz"))
	if len(tarballs) == 0 {
		return "", fmt.Errorf("citustest: no citus-*.tar.gz beside %s", script)
	}
	pg, err := serverRelease(ctx)
	if err != nil {
		return "", err
	}
	base := strings.TrimSuffix(filepath.Base(tarballs[0]), ".tar.gz") + "-pg" + pg
	dir, err := cacheDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // G301: the servers run as the postgres user, who must reach the build
		return "", fmt.Errorf("citustest: cache directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, base+".lock"), os.O_CREATE|os.O_RDWR, 0o600) //nolint:gosec // G304: our cache directory
	if err != nil {
		return "", fmt.Errorf("citustest: build lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil { //nolint:gosec // G115: a file descriptor fits an int
		return "", fmt.Errorf("citustest: build lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }() //nolint:gosec // G115: as above

	out := filepath.Join(dir, base)
	cmd := exec.CommandContext(ctx, "bash", script, out) //nolint:gosec // G204: our own build script, path from the repository or the test environment
	b, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("citustest: building Citus with %s failed: %w\n%s\n"+
			"It needs gcc, make and the PostgreSQL 15 server (apt-get install gcc make postgresql-15), "+
			"and downloads header packages with apt-get download (run apt-get update first)",
			script, err, strings.TrimSpace(string(b)))
	}
	bin := filepath.Join(out, "bin")
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		return "", fmt.Errorf("citustest: the build in %s has no bin/postgres: %w", out, err)
	}
	return bin, nil
}

// serverRelease is the installed PostgreSQL server's release ("15.20"),
// from the pg_config of the directory the build script uses ($PGBIN, else
// /usr/lib/postgresql/15/bin).
func serverRelease(ctx context.Context) (string, error) {
	bin := os.Getenv("PGBIN")
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_config"), "--version").Output() //nolint:gosec // G204: the server's own program
	if err != nil {
		return "", fmt.Errorf("citustest: %s/pg_config --version: %w (apt-get install postgresql-15)", bin, err)
	}
	// "PostgreSQL 15.20 (Debian 15.20-0+deb12u1)"
	f := strings.Fields(string(out))
	if len(f) < 2 || f[0] != "PostgreSQL" {
		return "", fmt.Errorf("citustest: %s/pg_config --version said %q, not PostgreSQL's release", bin, strings.TrimSpace(string(out)))
	}
	return f[1], nil
}

// cacheDir is $LEDGERKEEPER_CITUS_DIR, else /var/cache/ledgerkeeper when
// root (the servers run as the postgres user, who cannot reach into root's
// home), else the user's cache directory's ledgerkeeper/.
func cacheDir() (string, error) {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return d, nil
	}
	if os.Geteuid() == 0 {
		return "/var/cache/ledgerkeeper", nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("citustest: no cache directory (set %s): %w", EnvCacheDir, err)
	}
	return filepath.Join(cache, "ledgerkeeper"), nil
}

// Node is one server of the cluster.
type Node struct {
	// URL connects as the superuser "postgres" to database "postgres".
	URL string
	// Port is its TCP port on 127.0.0.1.
	Port int

	name    string
	data    string
	logPath string
	cmd     *exec.Cmd // nil while the node is stopped (StopNode)
	exited  chan struct{}
}

// Cluster is a running coordinator and its workers.
type Cluster struct {
	Coordinator *Node
	Workers     []*Node

	bin      string
	dir      string
	cred     *syscall.Credential
	stopOnce sync.Once
	createMu sync.Mutex
	frozen   map[string]bool // templates ready for copies (freeze), under createMu
}

// Nodes returns the workers, then the coordinator: the order databases are
// made in (a coordinator's database must find its workers' ready).
func (c *Cluster) Nodes() []*Node {
	return append(append([]*Node{}, c.Workers...), c.Coordinator)
}

// Start builds Citus (or reuses the build) and starts a coordinator and
// Workers workers on free loopback ports. When the process runs as root the
// servers run as the "postgres" OS user. Call Stop to shut them down and
// remove their directory.
func Start(ctx context.Context) (*Cluster, error) {
	bin, err := Build(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ledgerkeeper-citus-")
	if err != nil {
		return nil, fmt.Errorf("citustest: temp dir: %w", err)
	}
	c := &Cluster{bin: bin, dir: dir, cred: cred}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("citustest: chown %s to postgres: %w", dir, err)
		}
	}
	names := []string{"coordinator"}
	for i := 1; i <= Workers; i++ {
		names = append(names, fmt.Sprintf("worker%d", i))
	}
	for _, name := range names {
		n, err := c.startNode(ctx, name)
		if err != nil {
			c.Stop()
			return nil, err
		}
		if c.Coordinator == nil {
			c.Coordinator = n
		} else {
			c.Workers = append(c.Workers, n)
		}
	}
	return c, nil
}

func (c *Cluster) startNode(ctx context.Context, name string) (*Node, error) {
	data := filepath.Join(c.dir, name)
	initdb := exec.CommandContext(ctx, filepath.Join(c.bin, "initdb"), //nolint:gosec // G204: the built server's own program
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	initdb.Env = c.env()
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("citustest: initdb %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		n, err := c.startPostmaster(ctx, name, data, port)
		if err == nil {
			return n, nil
		}
		lastErr = err
		if ctx.Err() != nil || !strings.Contains(err.Error(), "in use") {
			break
		}
	}
	return nil, lastErr
}

func (c *Cluster) startPostmaster(ctx context.Context, name, data string, port int) (*Node, error) {
	n := &Node{Port: port, name: name, data: data, logPath: filepath.Join(c.dir, name+".log")}
	if err := c.postmaster(ctx, n, os.O_TRUNC); err != nil {
		return nil, err
	}
	return n, nil
}

// postmaster starts n's server on its data directory and port, its log
// opened with flag (O_TRUNC at first, O_APPEND on a restart), and waits
// until it accepts connections.
func (c *Cluster) postmaster(ctx context.Context, n *Node, flag int) error {
	name, data, port := n.name, n.data, n.Port
	exited := make(chan struct{})
	n.exited = exited
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", c.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "shared_preload_libraries=citus",
		"-c", "max_connections=400",
		"-c", "max_prepared_transactions=200", // Citus's two-phase commit across nodes
		// 4 shards per distributed table, not Citus's 32: every multi-shard
		// statement is a task per shard, and the tests' cost is in them;
		// 4 still puts two shards on each worker.
		"-c", "citus.shard_count=" + strconv.Itoa(ShardCount),
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
	}
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|flag, 0o600) //nolint:gosec // G304: the cluster's own directory
	if err != nil {
		return err
	}
	if c.cred != nil {
		_ = logf.Chown(int(c.cred.Uid), int(c.cred.Gid))
	}
	// Not tied to ctx: the node outlives Start; Stop ends it.
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), args...) //nolint:gosec,noctx // G204: the built server's own program
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = c.env()
	// SIGQUIT is PostgreSQL's immediate shutdown: if the test binary dies,
	// the node dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("citustest: start %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	n.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	for {
		select {
		case <-exited:
			out, _ := os.ReadFile(n.logPath)
			return fmt.Errorf("citustest: %s exited during start-up: %s", name, strings.TrimSpace(string(out)))
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-exited
			return fmt.Errorf("citustest: %s did not accept connections in time: %w", name, ctx.Err())
		case <-time.After(50 * time.Millisecond): // polling interval
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(pctx, n.URL)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			n.cmd = cmd
			return nil
		}
	}
}

// env is the nodes' environment: ours, with HOME the cluster's directory
// (libpq in a node, connecting to the others, reads ~/.postgresql; as root
// ours is /root, which the postgres user may not read) and no PG* variables.
func (c *Cluster) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "PG") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "HOME="+c.dir)
}

// Stop shuts every node down with pg_ctl -m fast (a Citus node refuses a
// plain SIGTERM while it holds connections to the others), an immediate
// shutdown after 20 s, and removes the cluster's directory. Safe to call
// more than once.
func (c *Cluster) Stop() {
	if c == nil {
		return
	}
	c.stopOnce.Do(func() {
		var wg sync.WaitGroup
		for _, n := range c.Nodes() {
			if n == nil || n.cmd == nil {
				continue
			}
			wg.Go(func() { c.stopNode(n) })
		}
		wg.Wait()
		_ = os.RemoveAll(c.dir)
	})
}

// stopNode shuts n down with pg_ctl -m fast, or SIGQUIT (an immediate
// shutdown) when it has not exited 20 s later, and waits for it to exit.
func (c *Cluster) stopNode(n *Node) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_ctl"), "-D", n.data, "-m", "fast", "-w", "-t", "20", "stop") //nolint:gosec // G204: the built server's own program
	stop.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	stop.Env = c.env()
	_ = stop.Run()
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Signal(syscall.SIGQUIT)
		<-n.exited
	}
	n.cmd = nil
}

// StopNode shuts one node down (pg_ctl -m fast: its sessions are ended,
// the coordinator's connections to it among them) and returns once its
// server has exited: a worker that is down while the cluster runs on. Its
// data stay; StartNode starts it again. Call it, StartNode and Stop from
// one goroutine.
func (c *Cluster) StopNode(n *Node) error {
	if n.cmd == nil {
		return fmt.Errorf("citustest: %s is not running", n.name)
	}
	c.stopNode(n)
	return nil
}

// StartNode starts a node StopNode stopped again, on its data directory
// and port (its log goes on in the same file), and returns once it
// accepts connections.
func (c *Cluster) StartNode(ctx context.Context, n *Node) error {
	if n.cmd != nil {
		return fmt.Errorf("citustest: %s is already running", n.name)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return c.postmaster(ctx, n, os.O_APPEND)
}

// Log returns a node's server log so far, for error reports.
func (n *Node) Log() string {
	b, _ := os.ReadFile(n.logPath)
	return string(b)
}

// WithDatabase returns the node URL u with its database replaced by db.
func WithDatabase(u, db string) string {
	return strings.Replace(u, "/postgres?", "/"+db+"?", 1)
}

// CreateDatabase makes database name on every node, workers first. With a
// template, each node's database is a copy of its own template (see the
// package comment); without one, name is a new Citus database: the
// extension on every node, and on the coordinator the coordinator's and
// the workers' addresses.
func (c *Cluster) CreateDatabase(ctx context.Context, name, template string) error {
	c.createMu.Lock() // PostgreSQL refuses a copy while another session is connected to the template
	defer c.createMu.Unlock()
	if template == "" {
		template = "template0"
	}
	if template != "template0" && !c.frozen[template] {
		if err := c.freeze(ctx, template); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes() {
		if err := Exec(ctx, n.URL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
			return fmt.Errorf("citustest: create database %s on port %d: %w", name, n.Port, err)
		}
	}
	if template != "template0" {
		return nil
	}
	for _, n := range c.Nodes() {
		if err := Exec(ctx, WithDatabase(n.URL, name), "CREATE EXTENSION citus"); err != nil {
			return fmt.Errorf("citustest: CREATE EXTENSION citus in %s on port %d: %w", name, n.Port, err)
		}
	}
	stmts := []string{fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", c.Coordinator.Port)}
	for _, w := range c.Workers {
		stmts = append(stmts, fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port))
	}
	for _, s := range stmts {
		if err := Exec(ctx, WithDatabase(c.Coordinator.URL, name), s); err != nil {
			return fmt.Errorf("citustest: %s in %s: %w", s, name, err)
		}
	}
	return nil
}

// freeze readies a template for copies: PostgreSQL copies a database only
// while nobody else is connected to it, and Citus keeps sessions in every
// Citus database (each node's maintenance daemon; the coordinator's
// connections to the workers). So, the coordinator first, then the
// workers: no new connections, and the existing ones ended.
func (c *Cluster) freeze(ctx context.Context, template string) error {
	id := pgx.Identifier{template}.Sanitize()
	for _, n := range append([]*Node{c.Coordinator}, c.Workers...) {
		conn, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			return fmt.Errorf("citustest: freeze template %s on port %d: %w", template, n.Port, err)
		}
		_, err = conn.Exec(ctx, "ALTER DATABASE "+id+" WITH ALLOW_CONNECTIONS false")
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, template)
		}
		if err == nil {
			// pg_terminate_backend only signals: wait for the sessions to end.
			deadline := time.Now().Add(10 * time.Second)
			for {
				var left int
				if err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, template).Scan(&left); err != nil || left == 0 {
					break
				}
				if time.Now().After(deadline) {
					err = fmt.Errorf("%d sessions still connected after 10 s", left)
					break
				}
				time.Sleep(20 * time.Millisecond) // polling interval
			}
		}
		_ = conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("citustest: freeze template %s on port %d: %w", template, n.Port, err)
		}
	}
	if c.frozen == nil {
		c.frozen = map[string]bool{}
	}
	c.frozen[template] = true
	return nil
}

// DropDatabases drops, on every node, each database whose name starts with
// prefix: what one test binary made. The coordinator goes first, so no
// worker database is dropped under a coordinator session still using it.
func (c *Cluster) DropDatabases(ctx context.Context, prefix string) error {
	nodes := append([]*Node{c.Coordinator}, c.Workers...)
	var errs []error
	for _, n := range nodes {
		conn, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE $1", prefix+"%")
		if err == nil {
			var names []string
			names, err = pgx.CollectRows(rows, pgx.RowTo[string])
			for _, name := range names {
				if _, e := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); e != nil {
					err = errors.Join(err, e)
				}
			}
		}
		errs = append(errs, err)
		_ = conn.Close(ctx)
	}
	return errors.Join(errs...)
}

// Exec runs sql on its own connection to url.
func Exec(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// runAs returns the credential to run the servers under when we are root.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("citustest: running as root, PostgreSQL must run as another user and there is no \"postgres\" user (apt-get install postgresql-15 creates it): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil //nolint:gosec // G115: ids from os/user, which are uint32 on Linux
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("citustest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
