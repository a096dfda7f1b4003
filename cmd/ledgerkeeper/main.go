// Command ledgerkeeper keeps an idempotency-key ledger in PostgreSQL honest:
// it resolves keys stuck in processing by asking the downstream, purges
// expired keys and alerts on what it cannot resolve. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ledgerkeeper/ledgerkeeper/internal/secret"
)

// Exit codes (README.md, "Command line"): 0 done, 1 operational failure, 2 usage or config.
const (
	exitOK          = 0
	exitOperational = 1
	exitUsage       = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: tests call it.
// Every line printed on stdout and every error printed on stderr goes
// through the configuration's redactor; logs go through it in their
// handler (app.load).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stderr: stderr}
	a.out = secret.NewWriter(stdout, a.redactor)
	a.stdout = a.out
	defer a.out.Flush()
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetOut(a.stdout)
	root.SetErr(stderr)
	ran, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	_ = a.out.Flush() // what the command printed comes before its error
	msg := a.redactor().String(err.Error())
	var ue *usageError
	var ce *configError
	switch {
	case errors.As(err, &ue), errors.As(err, &ce), isCobraUsage(err):
		fmt.Fprintf(stderr, "ledgerkeeper: %s\n", msg)
		if errors.As(err, &ue) || isCobraUsage(err) {
			// The help of the command that was mistyped, not the root's.
			path := "ledgerkeeper"
			if ran != nil {
				path = ran.CommandPath()
			}
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", path)
		}
		return exitUsage
	case errors.Is(err, errSilentFailure):
		return exitOperational
	default:
		fmt.Fprintf(stderr, "ledgerkeeper: %s\n", msg)
		return exitOperational
	}
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "ledgerkeeper",
		Short: "Keeps an idempotency-key ledger in PostgreSQL honest",
		Long: `ledgerkeeper finds idempotency keys stuck in processing past their tool's
window, asks the downstream through a per-tool probe whether the effect
exists, stores the outcome or marks the key failed_retryable, purges expired
keys, and alerts on Slack for everything it cannot resolve.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&a.configPath, "config", "", "configuration file (default ledgerkeeper.yaml if present)")
	root.PersistentFlags().StringVar(&a.databaseURL, "database-url", "", "PostgreSQL URL of the ledger (overrides database.url and $"+envDatabaseURL+")")
	root.PersistentFlags().StringVar(&a.ledgerName, "ledger", "", "the ledger to work on, by its name in the ledgers section (required when there are several; serve, migrate, status, config check and console without it work on every ledger)")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "", "debug, info, warn or error (overrides log.level)")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return &usageError{suggestFlag(cmd, err)} })
	root.AddCommand(
		newMigrateCmd(a),
		newConfigCmd(a),
		newPurgeCmd(a),
		newReconcileCmd(a),
		newInspectCmd(a),
		newResolveCmd(a),
		newHoldCmd(a),
		newReleaseCmd(a),
		newStatusCmd(a),
		newDemoCmd(a),
		newProbeCmd(a),
		newConformanceCmd(a),
		newServeCmd(a),
		newConsoleCmd(a),
		newVersionCmd(a),
	)
	parentOnly(root, true)
	strictBuiltins(root)
	setVersionFlag(root)
	return root
}

// usageError is a mistake in the command line: exit 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return &usageError{fmt.Errorf(format, args...)} }

// configError is a bad configuration: exit 2.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// errSilentFailure: the command already explained the failure; exit 1.
var errSilentFailure = errors.New("failed")

func isCobraUsage(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "unknown command") || strings.HasPrefix(s, "unknown flag") ||
		strings.HasPrefix(s, "unknown shorthand flag") || strings.Contains(s, "accepts ") ||
		strings.HasPrefix(s, "required flag")
}

// args returns a positional-argument validator whose errors are usage errors.
func args(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := v(cmd, a); err != nil {
			return &usageError{err}
		}
		return nil
	}
}
