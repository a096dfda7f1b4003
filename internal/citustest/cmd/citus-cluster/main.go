// Command citus-cluster runs a throwaway Citus cluster (package
// internal/citustest: a coordinator and citustest.Workers workers on
// loopback) for test suites that cannot import the daemon's module: the
// tool side's (ledger/), whose harness ledgertest takes a Citus cluster
// from the environment.
//
// Once the cluster accepts connections it prints the environment for
// ledgertest on stdout, one NAME=VALUE line each, and closes stdout:
//
//	LEDGERKEEPER_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
//	LEDGERKEEPER_TEST_CITUS_WORKERS=127.0.0.1:PORT,127.0.0.1:PORT
//
// It stops the cluster (and removes its directory) when its stdin closes,
// or on SIGTERM or SIGINT, and exits 0; it exits 1, saying why on stderr
// and printing nothing on stdout, when the cluster does not start. .ci/run
// builds it and runs the binary as a coprocess (not with go run, whose own
// process would hold stdout open): whatever way the script ends, its end
// closes the cluster's stdin.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/citustest"
)

// startTimeout bounds the build of Citus (minutes the first time, on a
// loaded machine) and the nodes' start.
const startTimeout = 15 * time.Minute

func main() {
	os.Exit(run())
}

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The stop path: stdin closed (its writer gone) or a signal.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()

	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	c, err := citustest.Start(sctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "citus-cluster: the cluster did not start: %v\n", err)
		return 1
	}
	defer c.Stop()

	workers := make([]string, len(c.Workers))
	for i, w := range c.Workers {
		workers[i] = "127.0.0.1:" + strconv.Itoa(w.Port)
	}
	if _, err := fmt.Fprintf(os.Stdout, "LEDGERKEEPER_TEST_DATABASE_URL=%s\nLEDGERKEEPER_TEST_CITUS_WORKERS=%s\n",
		c.Coordinator.URL, strings.Join(workers, ",")); err != nil {
		fmt.Fprintf(os.Stderr, "citus-cluster: print the environment: %v\n", err)
		return 1
	}
	// Closed: the reader's read to end of file is its signal that the
	// cluster is up.
	_ = os.Stdout.Close()
	fmt.Fprintf(os.Stderr, "citus-cluster: coordinator on port %d, workers on %s; close stdin or send SIGTERM to stop\n",
		c.Coordinator.Port, strings.Join(workers, ", "))

	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "citus-cluster: stopping the cluster")
	return 0
}
