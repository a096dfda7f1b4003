package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/pgtest"
	"github.com/ledgerkeeper/ledgerkeeper/internal/version"
	"github.com/ledgerkeeper/ledgerkeeper/ledger/ledgertest/testwait"
)

// version and --version print the binary's build, exit 0, and need neither
// a configuration nor a database.
func TestVersionCommand(t *testing.T) {
	want := version.Get()
	line := "ledgerkeeper " + want.Version + " (revision " + want.Revision + ", " + want.GoVersion + ")\n"
	for _, argv := range [][]string{{"version"}, {"--version"}, {"version", "--config", "/no/such/ledgerkeeper.yaml"}} {
		code, out, errb := cli(t, argv...)
		if code != exitOK || out != line || errb != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 0, stdout %q", argv, code, out, errb, line)
		}
	}

	code, out, errb := cli(t, "version", "--json")
	if code != exitOK {
		t.Fatalf("version --json: exit %d, stderr %q", code, errb)
	}
	var got struct{ Version, Revision, GoVersion string }
	if err := json.Unmarshal([]byte(strings.ReplaceAll(out, "go_version", "goversion")), &got); err != nil {
		t.Fatalf("version --json: %v in %q", err, out)
	}
	if got.Version != want.Version || got.Revision != want.Revision || got.GoVersion != want.GoVersion {
		t.Errorf("version --json = %+v, want %+v", got, want)
	}

	if code, _, _ := cli(t, "version", "extra"); code != exitUsage {
		t.Errorf("version extra: exit %d, want %d", code, exitUsage)
	}
}

// serve exports ledgerkeeper_build_info with the same version as the version
// command, so a scrape tells which release each replica runs.
func TestServeExportsBuildInfo(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	addr := freeAddr(t)
	cfg := writeFile(t, "serve.yaml", fmt.Sprintf("schedule:\n  reconcile: \"@every 1h\"\n  purge: \"@every 1h\"\n  alerts: \"@every 1h\"\nhttp:\n  listen: %q\n", addr))
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	var stderr syncBuffer // serve keeps logging while the test reads
	go func() {
		exited <- run(ctx, []string{"serve", "--config", cfg, "--database-url", db.URL}, io.Discard, &stderr)
	}()
	stopped := false
	stop := func() int {
		if stopped {
			return 0
		}
		stopped = true
		cancel()
		return testwait.Recv(t, exited, 40*time.Second)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("serve's stderr:\n%s", stderr.String())
		}
	})
	info := version.Get()
	want := fmt.Sprintf(`ledgerkeeper_build_info{go_version=%q,revision=%q,version=%q} 1`, info.GoVersion, info.Revision, info.Version)
	testwait.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), want)
	}, 30*time.Second, "serve's /metrics to carry "+want)
	if code := stop(); code != exitOK {
		t.Fatalf("serve exited %d:\n%s", code, stderr.String())
	}
}
