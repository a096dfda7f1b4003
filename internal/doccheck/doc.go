// Package doccheck holds tests only: they check that what README.md,
// runbook.md and deploy/ tell an operator (metric names and labels, the
// CLI's commands and flags) exists in the code, so the docs cannot drift
// from it unnoticed.
package doccheck
