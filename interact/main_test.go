package interact

import (
	"testing"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
)

// TestMain gives the package's tests a PostgreSQL and checks for leaked
// goroutines (pgtest.Main runs goleak).
func TestMain(m *testing.M) { pgtest.Main(m) }
