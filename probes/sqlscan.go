package probes

import (
	"errors"
	"fmt"
	"strings"
)

// sqlShape is what scanSQL learns of a query's text.
type sqlShape struct {
	// params holds the numbers of the $n parameters used.
	params map[int]bool
	// maxParam is the highest $n.
	maxParam int
	// body is the query without one trailing ';' (and what follows it).
	body string
}

// scanSQL checks that query is a single statement, and collects its $n
// parameters. It understands what can hide a ';' or a '$1' in PostgreSQL's
// lexer: '…' strings (a doubled quote escapes one; E'…' also \ escapes),
// "…" identifiers, -- line comments, nested /* */ comments and
// $tag$…$tag$ dollar quotes.
// It is deliberately a scanner, not a parser: it refuses what it cannot
// classify, and PostgreSQL's extended protocol (which refuses several
// statements in one query) is the second line of defence.
func scanSQL(query string) (sqlShape, error) {
	sh := sqlShape{params: map[int]bool{}, body: query}
	s := query
	semicolon := -1 // position of the statement's terminating ';'
	tokens := false // saw anything but whitespace and comments
	for i := 0; i < len(s); {
		c := s[i]
		if semicolon >= 0 && !isSpace(c) && !strings.HasPrefix(s[i:], "--") && !strings.HasPrefix(s[i:], "/*") {
			return sh, errors.New("query has more than one statement (a ';' outside strings and comments); a probe runs exactly one SELECT")
		}
		switch {
		case isSpace(c):
			i++
		case strings.HasPrefix(s[i:], "--"):
			nl := strings.IndexByte(s[i:], '\n')
			if nl < 0 {
				i = len(s)
			} else {
				i += nl + 1
			}
		case strings.HasPrefix(s[i:], "/*"):
			end, err := skipBlockComment(s, i)
			if err != nil {
				return sh, err
			}
			i = end
		case c == ';':
			if !tokens {
				return sh, errors.New("query is empty before its ';'")
			}
			semicolon = i
			i++
		case c == '\'':
			escapes := i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i < 2 || !isIdentChar(s[i-2]))
			end, err := skipQuoted(s, i, '\'', escapes)
			if err != nil {
				return sh, err
			}
			tokens = true
			i = end
		case c == '"':
			end, err := skipQuoted(s, i, '"', false)
			if err != nil {
				return sh, err
			}
			tokens = true
			i = end
		case c == '$':
			tokens = true
			if i > 0 && isIdentChar(s[i-1]) {
				// Part of an identifier such as a$1 (PostgreSQL allows '$'
				// after an identifier's first character).
				i++
				continue
			}
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j > i+1 {
				if j-i-1 > 5 {
					return sh, fmt.Errorf("parameter %s is out of range", s[i:j])
				}
				n := 0
				for _, d := range s[i+1 : j] {
					n = n*10 + int(d-'0')
				}
				if n == 0 {
					return sh, errors.New("parameter $0 does not exist: parameters start at $1")
				}
				sh.params[n] = true
				sh.maxParam = max(sh.maxParam, n)
				i = j
				continue
			}
			end, err := skipDollarQuoted(s, i)
			if err != nil {
				return sh, err
			}
			i = end
		case isIdentChar(c):
			// Whole identifiers, so that a '$' inside one is seen as such.
			tokens = true
			for i < len(s) && isIdentChar(s[i]) {
				i++
			}
		default:
			tokens = true
			i++
		}
	}
	if !tokens {
		return sh, errors.New("query is empty")
	}
	if semicolon >= 0 {
		sh.body = query[:semicolon]
	}
	return sh, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// isIdentChar reports whether c can continue an identifier: letters, digits,
// '_', '$' and any non-ASCII byte (PostgreSQL treats those as letters).
func isIdentChar(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// skipQuoted returns the index after the literal opening at s[i]. A doubled
// quote is an escaped quote; with backslashEscapes (E'…'), so is \'.
func skipQuoted(s string, i int, q byte, backslashEscapes bool) (int, error) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if backslashEscapes {
				j++ // skip the escaped byte
			}
		case q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1, nil
		}
	}
	if q == '"' {
		return 0, errors.New(`query has an unterminated quoted identifier (")`)
	}
	return 0, errors.New("query has an unterminated string literal (')")
}

// skipBlockComment returns the index after the comment opening at s[i];
// PostgreSQL's block comments nest.
func skipBlockComment(s string, i int) (int, error) {
	depth := 0
	for j := i; j < len(s)-1; {
		switch {
		case s[j] == '/' && s[j+1] == '*':
			depth++
			j += 2
		case s[j] == '*' && s[j+1] == '/':
			depth--
			j += 2
			if depth == 0 {
				return j, nil
			}
		default:
			j++
		}
	}
	return 0, errors.New("query has an unterminated /* comment")
}

// skipDollarQuoted returns the index after the dollar-quoted string opening
// at s[i] ($$…$$ or $tag$…$tag$, the tag being an identifier that does not
// start with a digit).
func skipDollarQuoted(s string, i int) (int, error) {
	j := i + 1
	for j < len(s) && s[j] != '$' && isIdentChar(s[j]) {
		j++
	}
	if j >= len(s) || s[j] != '$' {
		return 0, errors.New("query has a '$' that is neither a parameter ($1) nor a dollar quote ($$…$$)")
	}
	tag := s[i : j+1]
	end := strings.Index(s[j+1:], tag)
	if end < 0 {
		return 0, fmt.Errorf("query has an unterminated dollar-quoted string (%s)", tag)
	}
	return j + 1 + end + len(tag), nil
}
