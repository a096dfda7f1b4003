package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// suggestDistance is how many edits away a typed command may be from a
// real one and still be suggested ("chek" for "check").
const suggestDistance = 2

// unknownCommand is the usage error (exit 2) for a command or sub-command
// that does not exist, with the nearest names when some are close:
// "unknown command "chek" for "ledgerkeeper config" (did you mean check?); the commands are check".
func unknownCommand(typed, path string, names []string) error {
	msg := fmt.Sprintf("unknown command %q for %q", typed, path)
	if s := suggest(typed, names); len(s) > 0 {
		msg += " (did you mean " + strings.Join(s, " or ") + "?)"
	}
	msg += "; the commands are " + strings.Join(names, ", ")
	return &usageError{fmt.Errorf("%s", msg)}
}

// suggest returns the names within suggestDistance edits of typed, or
// starting with it.
func suggest(typed string, names []string) []string {
	var out []string
	t := strings.ToLower(typed)
	for _, n := range names {
		if editDistance(t, strings.ToLower(n)) <= suggestDistance || (t != "" && strings.HasPrefix(strings.ToLower(n), t)) {
			out = append(out, n)
		}
	}
	return out
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur := make([]int, len(rb)+1)
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(rb)]
}

// suggestFlag adds the nearest flags of cmd to pflag's "unknown flag:
// --limt" ("(did you mean --limit?)").
func suggestFlag(cmd *cobra.Command, err error) error {
	typed, isUnknown := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !isUnknown {
		return err
	}
	typed, _, _ = strings.Cut(typed, "=")
	var names []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	s := suggest(typed, names)
	if len(s) == 0 {
		return err
	}
	for i := range s {
		s[i] = "--" + s[i]
	}
	return fmt.Errorf("%w (did you mean %s?)", err, strings.Join(s, " or "))
}

// subcommandNames lists cmd's visible sub-commands.
func subcommandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return names
}

// parentOnly makes cmd, a command that only groups sub-commands, refuse an
// unknown sub-command with a usage error (exit 2) instead of printing its
// help and exiting 0 (a CI step "ledgerkeeper config chek" must fail).
// Without a sub-command it is a usage error too, unless helpWhenBare (the
// root: plain "ledgerkeeper" prints its help).
func parentOnly(cmd *cobra.Command, helpWhenBare bool) {
	cmd.Args = func(c *cobra.Command, argv []string) error {
		if len(argv) > 0 {
			return unknownCommand(argv[0], c.CommandPath(), subcommandNames(c))
		}
		return nil
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		if helpWhenBare {
			return c.Help()
		}
		return usagef("%s needs a sub-command: %s", c.CommandPath(), strings.Join(subcommandNames(c), " or "))
	}
}

// strictBuiltins holds cobra's own commands to the same rule: "help chek"
// and "completion zhs" are usage errors (exit 2), not help and exit 0.
func strictBuiltins(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Args = func(c *cobra.Command, argv []string) error {
				found, rest, err := c.Root().Find(argv)
				if err != nil {
					return &usageError{err}
				}
				if len(rest) > 0 {
					return unknownCommand(rest[0], found.CommandPath(), subcommandNames(found))
				}
				return nil
			}
		case "completion":
			parentOnly(c, false)
		}
	}
}
