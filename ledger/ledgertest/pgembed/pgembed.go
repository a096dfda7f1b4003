// Package pgembed starts a throwaway PostgreSQL cluster from the local
// PostgreSQL binaries: for the test harnesses (package ledgertest, and the
// daemon's, when no database URL is given and no Docker engine answers), for
// `ledgerkeeper demo` and for lkbench. It is a package of its own, apart from
// ledgertest, because a program that starts a cluster must not link the test
// harness (package testing).
//
// The cluster lives in a temporary directory, listens on 127.0.0.1 on a free
// port and on a unix socket inside that directory, trusts local connections
// and is removed by Stop. When the process runs as root, PostgreSQL (which
// refuses to run as root) runs as the "postgres" OS user. The postmaster is
// a direct child with a parent-death signal, so a killed parent does not
// leave a cluster behind.
package pgembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options tune the cluster. Zero values are sensible for tests.
type Options struct {
	// Settings are extra server settings passed as -c name=value.
	Settings map[string]string
	// Durable keeps fsync on. Off by default: the cluster is thrown away.
	Durable bool
	// StartTimeout bounds initdb plus start-up. Default 60s.
	StartTimeout time.Duration
}

// startTimeout is StartTimeout, or its default of 60s.
func (o Options) startTimeout() time.Duration {
	if o.StartTimeout == 0 {
		return 60 * time.Second
	}
	return o.StartTimeout
}

// Server is a running ephemeral cluster.
type Server struct {
	// URL connects as the superuser "postgres" to database "postgres".
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// BinDir is where the PostgreSQL binaries were found.
	BinDir string

	dir     string
	data    string
	opts    Options
	cred    *syscall.Credential
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped sync.Once
	logPath string
}

// WithDatabase returns the PostgreSQL URL u with its database replaced by
// db: the URL of another database on the same server (a Server's URL names
// "postgres"). It panics when u is not a URL.
func WithDatabase(u, db string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		panic(fmt.Sprintf("pgembed: bad URL: %v", err))
	}
	parsed.Path = "/" + db
	return parsed.String()
}

// FindBinDir locates initdb and postgres: $PATH first, then the Debian layout
// /usr/lib/postgresql/<version>/bin (newest first).
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool {
		return versionOf(matches[i]) > versionOf(matches[j])
	})
	for _, m := range matches {
		return filepath.Dir(m), nil
	}
	return "", errors.New("no PostgreSQL binaries: initdb is not on PATH and /usr/lib/postgresql/*/bin/initdb does not exist (install PostgreSQL, e.g. apt-get install postgresql)")
}

func versionOf(initdbPath string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdbPath))))
	return v
}

// Start creates and starts a cluster. Call Stop to remove it.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.startTimeout())
	defer cancel()

	cred, uid, gid, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ledgerkeeper-pg-")
	if err != nil {
		return nil, fmt.Errorf("temp dir for PostgreSQL: %w", err)
	}
	s := &Server{BinDir: bin, dir: dir, exited: make(chan struct{}), logPath: filepath.Join(dir, "postgres.log"), opts: opts, cred: cred}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(fmt.Errorf("chown %s to postgres: %w", dir, err))
		}
	}
	data := filepath.Join(dir, "data")
	s.data = data
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w: %s", err, strings.TrimSpace(string(out))))
	}

	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		err = s.startPostmaster(ctx, data, port, cred, opts)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil || !strings.Contains(err.Error(), "in use") {
			return fail(err)
		}
	}
	return fail(errors.New("could not find a free port for PostgreSQL"))
}

func (s *Server) startPostmaster(ctx context.Context, data string, port int, cred *syscall.Credential, opts Options) error {
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=400"}
	if !opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	keys := make([]string, 0, len(opts.Settings))
	for k := range opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+opts.Settings[k])
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) // appended to across a Restart
	if err != nil {
		return err
	}
	if cred != nil {
		_ = logf.Chown(int(cred.Uid), int(cred.Gid))
	}
	cmd := exec.Command(filepath.Join(s.BinDir, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGQUIT is PostgreSQL's immediate shutdown: if we die, it dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	for {
		select {
		case <-exited:
			out, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("postgres exited during start-up: %s", strings.TrimSpace(string(out)))
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-exited
			return fmt.Errorf("postgres did not accept connections in time: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(pctx, url)
		cancel()
		if err == nil {
			_ = conn.Close(context.Background())
			s.URL, s.Port, s.cmd, s.exited = url, port, cmd, exited
			return nil
		}
	}
}

// Restart shuts the cluster down (fast shutdown: a checkpoint, then every
// session ends) and starts it again on the same port with the same
// settings, so the server's shared buffers start empty; whileDown, when not
// nil, runs in between with the data directory's path (a benchmark evicts
// the files from the operating system's cache there). Open connections are
// gone afterwards. Not safe to call concurrently with itself or Stop.
func (s *Server) Restart(ctx context.Context, whileDown func(dataDir string) error) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return errors.New("pgembed: restart of a cluster that is not running")
	}
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		return fmt.Errorf("pgembed: stop for restart: %w", err)
	}
	select {
	case <-s.exited:
	case <-ctx.Done():
		return fmt.Errorf("pgembed: waiting for the shutdown: %w", ctx.Err())
	}
	if whileDown != nil {
		if err := whileDown(s.data); err != nil {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, s.opts.startTimeout())
	defer cancel()
	if err := s.startPostmaster(sctx, s.data, s.Port, s.cred, s.opts); err != nil {
		return fmt.Errorf("pgembed: restart: %w", err)
	}
	return nil
}

// Stop shuts the cluster down (fast shutdown, then immediate) and removes its
// directory. Safe to call more than once.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	s.stopped.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-s.exited:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Signal(syscall.SIGQUIT)
				<-s.exited
			}
		}
		_ = os.RemoveAll(s.dir)
	})
}

// Log returns the server log so far, for error reports.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// runAs returns the credential to run PostgreSQL under when we are root.
func runAs() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, 0, 0, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("running as root, PostgreSQL must run as another user and there is no \"postgres\" user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil //nolint:gosec // G115: ids from os/user, which are uint32 on Linux
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
