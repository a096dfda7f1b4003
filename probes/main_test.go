package probes_test

import (
	"flag"
	"os"
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// The sql probe is tested against a real PostgreSQL (see sql_test.go).
func TestMain(m *testing.M) {
	flag.Parse()
	// A fuzz worker process (go test -fuzz) runs one fuzz target, which
	// never touches the database: starting a cluster in every worker, and
	// again whenever the fuzzer restarts one, would stall fuzzing.
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		os.Exit(m.Run())
	}
	pgtest.Main(m)
}
