package probes

import (
	"slices"
	"testing"
)

func TestScanSQL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		query  string
		params []int  // nil: refused
		body   string // the query without its trailing ';', if different
	}{
		{"SELECT 1", []int{}, ""},
		{"SELECT $1, $2, $1", []int{1, 2}, ""},
		{"SELECT $10", []int{10}, ""},
		{"SELECT 1;", []int{}, "SELECT 1"},
		{"SELECT 1 ;  \n\t", []int{}, "SELECT 1 "},
		{"SELECT 1; -- done", []int{}, "SELECT 1"},
		{"SELECT 1; /* done; */", []int{}, "SELECT 1"},
		{"SELECT ';'", []int{}, ""},
		{"SELECT 'a''b;$1'", []int{}, ""},
		{"SELECT '\\'; SELECT 2", nil, ""}, // standard strings: the backslash is literal
		{`SELECT E'\';$1'`, []int{}, ""},
		{`SELECT e'\\'; SELECT 2`, nil, ""},
		{`SELECT E'\\\';$1'`, []int{}, ""},
		{`SELECT x'ff', b'01', U&'d\0061t'`, []int{}, ""},
		{`SELECT 1 AS "a;""$1"`, []int{}, ""},
		{"SELECT 1 -- ; $1\n, $2", []int{2}, ""},
		{"SELECT /* ; /* $1 */ ; */ $2", []int{2}, ""},
		{"SELECT $$;$1$$, $2", []int{2}, ""},
		{"SELECT $a$ $$ ; $1 $a$, $2", []int{2}, ""},
		{"SELECT $_b1$ ; $_b1$", []int{}, ""},
		{"SELECT a$1 FROM t", []int{}, ""}, // '$' inside an identifier
		{"SELECT ünï$1", []int{}, ""},
		{"SELECT 1; SELECT 2", nil, ""},
		{"SELECT 1;;", nil, ""},
		{"SELECT 1; ;", nil, ""},
		{";", nil, ""},
		{"", nil, ""},
		{" -- only a comment", nil, ""},
		{"/* only */", nil, ""},
		{"SELECT 'open", nil, ""},
		{`SELECT "open`, nil, ""},
		{"SELECT /* open", nil, ""},
		{"SELECT /* /* */", nil, ""},
		{"SELECT $$ open", nil, ""},
		{"SELECT $a$ open $b$", nil, ""},
		{"SELECT $ 1", nil, ""},
		{"SELECT $0", nil, ""},
		{"SELECT $123456", nil, ""},
		{"SELECT 1;\nDELETE FROM t", nil, ""},
		{"SELECT 1 -- c\n; DELETE FROM t", nil, ""},
	}
	for _, tt := range tests {
		sh, err := scanSQL(tt.query)
		if tt.params == nil {
			if err == nil {
				t.Errorf("%q accepted", tt.query)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.query, err)
			continue
		}
		var got []int
		for n := range sh.params {
			got = append(got, n)
		}
		slices.Sort(got)
		if !slices.Equal(got, tt.params) && !(len(got) == 0 && len(tt.params) == 0) {
			t.Errorf("%q: params %v, want %v", tt.query, got, tt.params)
		}
		if want := max(0, slices.Max(append([]int{0}, tt.params...))); sh.maxParam != want {
			t.Errorf("%q: maxParam %d, want %d", tt.query, sh.maxParam, want)
		}
		wantBody := tt.body
		if wantBody == "" {
			wantBody = tt.query
		}
		if sh.body != wantBody {
			t.Errorf("%q: body %q, want %q", tt.query, sh.body, wantBody)
		}
	}
}
