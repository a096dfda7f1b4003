// Package hatest starts highly available PostgreSQL set-ups on loopback for
// the failover tests: a pg_auto_failover formation (a monitor and two
// nodes, Debian's postgresql-15-auto-failover and pg-auto-failover-cli),
// and a streaming pair for a role flip without closed sockets (the old
// primary turns read-only by a configuration reload, the standby is
// promoted), the way Aurora flips roles.
//
// Everything listens on 127.0.0.1 and lives in a temporary directory;
// PostgreSQL and pg_autoctl run as the "postgres" user when the tests run
// as root. A missing binary fails the test with what to install.
package hatest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/pgembed"
)

// Install is what to install when a binary is missing.
const Install = "apt-get install postgresql-15 postgresql-15-auto-failover pg-auto-failover-cli"

// MonitorSettings shorten pg_auto_failover's failure detection (defaults:
// checks every 5 s, a node unhealthy after 20 s, 30 s for a dead primary
// to demote itself: about 50 s from a kill -9 to a new primary) so that an
// unplanned failover takes seconds. The planned one does not depend on
// them.
//
// Not shorter than this: a secondary the monitor wrongly finds unhealthy
// (a check or a report late on a loaded two-core machine) turns the
// primary to wait_primary, which commits without waiting for the
// standby, and a failover then can lose commits the primary acknowledged
// (seen once in CI: calls acknowledged by the tool server with no row on
// the new primary after the planned switchover). Checks get 3 s and two
// retries, and a node is unhealthy after 10 s without a report.
var MonitorSettings = map[string]string{
	"pgautofailover.health_check_period":               "1000",
	"pgautofailover.health_check_timeout":              "3000",
	"pgautofailover.health_check_retry_delay":          "1000",
	"pgautofailover.health_check_max_retries":          "2",
	"pgautofailover.node_considered_unhealthy_timeout": "10000",
	"pgautofailover.primary_demote_timeout":            "5000",
}

// proc is a child process group we started.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// env runs commands as postgres (when root) with pg_autoctl's state
// under dir.
type env struct {
	dir  string
	cred *syscall.Credential
	bin  string // PostgreSQL's bin directory
}

func newEnv() (*env, error) {
	bin, err := pgembed.FindBinDir()
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, Install)
	}
	dir, err := os.MkdirTemp("", "ledgerkeeper-ha-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, PostgreSQL must run as the postgres user: %w (%s)", err, Install)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		e.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)} //nolint:gosec // G115: a uid/gid from /etc/passwd
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"config", "data", "run"} {
		if err := e.mkdir(filepath.Join(dir, "xdg", d)); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func (e *env) mkdir(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	if e.cred != nil {
		for p := path; strings.HasPrefix(p, e.dir) && p != e.dir; p = filepath.Dir(p) {
			if err := os.Chown(p, int(e.cred.Uid), int(e.cred.Gid)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *env) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...) //nolint:gosec // G204: pg_autoctl and PostgreSQL's binaries, arguments of our own
	cmd.Env = append(os.Environ(),
		"XDG_CONFIG_HOME="+filepath.Join(e.dir, "xdg", "config"),
		"XDG_DATA_HOME="+filepath.Join(e.dir, "xdg", "data"),
		"XDG_RUNTIME_DIR="+filepath.Join(e.dir, "xdg", "run"),
		"PG_CONFIG="+filepath.Join(e.bin, "pg_config"),
		"PATH="+e.bin+":"+os.Getenv("PATH"),
		"HOME="+e.dir,
	)
	cmd.Dir = e.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: e.cred, Setpgid: true, Pdeathsig: syscall.SIGTERM}
	return cmd
}

// run runs a command to its end, returning its output in the error.
func (e *env) run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := e.command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(string(out), 15))
	}
	return string(out), nil
}

// start starts a long-running command, its output in logName.
func (e *env) start(logName, name string, args ...string) (*proc, error) {
	logPath := filepath.Join(e.dir, logName)
	f, err := os.Create(logPath) //nolint:gosec // G304: a log file in our own temporary directory
	if err != nil {
		return nil, err
	}
	// Long-running: stopped by signals (proc.stop, proc.kill), never by a context.
	cmd := e.command(context.Background(), name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

// stop ends p's process group: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil || !p.alive() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// kill is kill -9 of p's whole process group (pg_autoctl and its
// PostgreSQL): the node dies at once, no socket closed cleanly.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// tail is the end of p's log.
func (p *proc) tail() string {
	out, _ := os.ReadFile(p.log)
	return lastLines(string(out), 20)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePorts returns n TCP ports free on 127.0.0.1 now.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// nodeURL connects as postgres to database db on port.
func nodeURL(port int, db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", port, db)
}

// query runs one statement on a fresh connection.
func query(ctx context.Context, url, sql string, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if len(dest) == 0 {
		_, err = conn.Exec(ctx, sql)
		return err
	}
	return conn.QueryRow(ctx, sql).Scan(dest...)
}

// poll runs cond until it returns true or ctx ends.
func poll(ctx context.Context, every time.Duration, what string, cond func() bool) error {
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(every):
		}
	}
}

// Formation is a pg_auto_failover monitor and two PostgreSQL nodes.
type Formation struct {
	// Ports are the two nodes' ports, node1 first.
	Ports [2]int
	// MonitorPort is the monitor's.
	MonitorPort int

	e       *env
	monitor *proc
	nodes   [2]*proc
	mu      sync.Mutex
}

// StartFormation starts a monitor and two nodes and waits until node1 is
// primary and node2 its secondary. Stop it when done.
func StartFormation(ctx context.Context) (*Formation, error) {
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return nil, fmt.Errorf("pg_autoctl not found: %s", Install)
	}
	e, err := newEnv()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	f := &Formation{e: e, MonitorPort: ports[0], Ports: [2]int{ports[1], ports[2]}}
	fail := func(err error) (*Formation, error) {
		f.Stop()
		return nil, err
	}
	pgctl := filepath.Join(e.bin, "pg_ctl")
	mon := filepath.Join(e.dir, "monitor")
	if _, err := e.run(ctx, "pg_autoctl", "create", "monitor", "--pgdata", mon, "--pgport", strconv.Itoa(f.MonitorPort),
		"--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", pgctl); err != nil {
		return fail(err)
	}
	// Faster failure detection, before the monitor runs.
	var conf strings.Builder
	for k, v := range MonitorSettings {
		fmt.Fprintf(&conf, "%s = %s\n", k, v)
	}
	af, err := os.OpenFile(filepath.Join(mon, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0) //nolint:gosec // G304: the monitor's configuration in our own temporary directory
	if err != nil {
		return fail(err)
	}
	_, err = af.WriteString(conf.String())
	af.Close()
	if err != nil {
		return fail(err)
	}
	if f.monitor, err = e.start("monitor.log", "pg_autoctl", "run", "--pgdata", mon); err != nil {
		return fail(err)
	}
	monURL := f.MonitorURL()
	if err := poll(ctx, 200*time.Millisecond, "the monitor to accept connections", func() bool {
		return query(ctx, monURL, "SELECT 1") == nil
	}); err != nil {
		return fail(fmt.Errorf("%w: %s", err, f.Logs()))
	}
	for i := range 2 {
		name := fmt.Sprintf("node%d", i+1)
		f.nodes[i], err = e.start(name+".log", "pg_autoctl", "create", "postgres", "--pgdata", filepath.Join(e.dir, name),
			"--pgport", strconv.Itoa(f.Ports[i]), "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--name", name,
			"--auth", "trust", "--no-ssl", "--pgctl", pgctl, "--monitor", monURL, "--run")
		if err != nil {
			return fail(err)
		}
		want := map[string]string{"node1": "single"} // alone, it is not yet a primary
		if i == 1 {
			want = map[string]string{"node1": "primary", "node2": "secondary"}
		}
		if err := f.waitStates(ctx, want); err != nil {
			return fail(err)
		}
	}
	return f, nil
}

// MonitorURL is the monitor's database, as pg_autoctl's nodes reach it.
func (f *Formation) MonitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.MonitorPort)
}

// URL is the formation's URL for database db: both nodes, read-write.
func (f *Formation) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		f.Ports[0], f.Ports[1], db)
}

// states reads each node's reported and assigned state from the monitor.
func (f *Formation) states(ctx context.Context) (map[string][2]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.MonitorURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node`)
	if err != nil {
		return nil, err
	}
	out := map[string][2]string{}
	for rows.Next() {
		var n, r, g string
		if err := rows.Scan(&n, &r, &g); err != nil {
			return nil, err
		}
		out[n] = [2]string{r, g}
	}
	return out, rows.Err()
}

// waitStates waits until every named node reports and is assigned its state.
func (f *Formation) waitStates(ctx context.Context, want map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last map[string][2]string
	err := poll(ctx, 250*time.Millisecond, fmt.Sprintf("nodes in states %v", want), func() bool {
		st, err := f.states(ctx)
		if err != nil {
			return false
		}
		last = st
		for n, s := range want {
			if st[n] != [2]string{s, s} {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w (last seen %v)\n%s", err, last, f.Logs())
	}
	return nil
}

// Primary is the index (0 or 1) of the node that takes writes now, or -1.
func (f *Formation) Primary(ctx context.Context) int {
	for i, p := range f.Ports {
		var ro string
		if err := query(ctx, nodeURL(p, "postgres"), "SHOW transaction_read_only", &ro); err == nil && ro == "off" {
			return i
		}
	}
	return -1
}

// PerformFailover is `pg_autoctl perform failover`: a planned switchover
// to the secondary. It returns once the monitor reports the new roles.
func (f *Formation) PerformFailover(ctx context.Context) error {
	_, err := f.e.run(ctx, "pg_autoctl", "perform", "failover", "--pgdata", filepath.Join(f.e.dir, "monitor"))
	return err
}

// KillPrimary is kill -9 of the primary node (its pg_autoctl and
// PostgreSQL at once). It returns the index of the node killed.
func (f *Formation) KillPrimary(ctx context.Context) (int, error) {
	i := f.Primary(ctx)
	if i < 0 {
		return -1, errors.New("no primary to kill")
	}
	f.nodes[i].kill()
	return i, nil
}

// WaitWritable waits until node i takes writes.
func (f *Formation) WaitWritable(ctx context.Context, i int) error {
	return poll(ctx, 100*time.Millisecond, fmt.Sprintf("node%d to take writes", i+1), func() bool {
		var ro string
		return query(ctx, nodeURL(f.Ports[i], "postgres"), "SHOW transaction_read_only", &ro) == nil && ro == "off"
	})
}

// Exec runs sql on the primary's database db.
func (f *Formation) Exec(ctx context.Context, db, sql string) error {
	return query(ctx, f.URL(db), sql)
}

// Logs returns the end of each pg_autoctl log, for failure reports.
func (f *Formation) Logs() string {
	var b strings.Builder
	for _, name := range []string{"monitor.log", "node1.log", "node2.log"} {
		out, err := os.ReadFile(filepath.Join(f.e.dir, name)) //nolint:gosec // G304: a log in our own temporary directory
		if err == nil {
			fmt.Fprintf(&b, "--- %s\n%s\n", name, lastLines(string(out), 20))
		}
	}
	return b.String()
}

// Stop stops the nodes and the monitor and removes their directory.
func (f *Formation) Stop() {
	if f == nil || f.e == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range f.nodes {
		wg.Go(func() { n.stop(20 * time.Second) })
	}
	wg.Wait()
	f.monitor.stop(20 * time.Second)
	_ = removeAll(f.e.dir)
}

// Start is StartFormation for a test: stopped when the test ends, a
// failure to start fatal with what to install.
func Start(t testing.TB) *Formation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, err := StartFormation(ctx)
	if err != nil {
		t.Fatalf("hatest: start a pg_auto_failover formation (%s): %v", Install, err)
	}
	t.Cleanup(f.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			// Cleanups run last first: the formation is still up.
			t.Logf("pg_auto_failover's events:\n%s\n%s", f.Events(), f.Logs())
		}
	})
	return f
}

// Events are the monitor's state changes, oldest first (a wait_primary
// among them says the primary committed without its standby for a while).
func (f *Formation) Events() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.MonitorURL())
	if err != nil {
		return "events: " + err.Error()
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT eventtime::text, nodename, reportedstate::text, goalstate::text, description
		FROM pgautofailover.event ORDER BY eventid`)
	if err != nil {
		return "events: " + err.Error()
	}
	var b strings.Builder
	for rows.Next() {
		var at, node, reported, goal, desc string
		if err := rows.Scan(&at, &node, &reported, &goal, &desc); err != nil {
			return "events: " + err.Error()
		}
		fmt.Fprintf(&b, "%s %s %s→%s %s\n", at, node, reported, goal, desc)
	}
	if err := rows.Err(); err != nil {
		return "events: " + err.Error()
	}
	return b.String()
}

func removeAll(dir string) error { return os.RemoveAll(dir) }
