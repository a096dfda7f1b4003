package ledger

import (
	"errors"
	"testing"
)

func TestParseKeyHeader(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{in: "wf-1:step-2", want: "wf-1:step-2"},
		{in: `"wf-1:step-2"`, want: "wf-1:step-2"},
		{in: ` "wf-1:step-2" `, want: "wf-1:step-2"},
		{in: `"a \"quoted\" key \\ here"`, want: `a "quoted" key \ here`},
		{in: `"wf-1";v=1`, want: "wf-1"},
		{in: `""`, want: ""},
		{in: `"no closing quote`, bad: true},
		{in: `"bad escape \n"`, bad: true},
		{in: `"trailing"garbage`, bad: true},
		{in: "\"tab\tinside\"", bad: true},
		{in: "\"caf\u00e9\"", bad: true},
		{in: `wf-"odd"`, want: `wf-"odd"`}, // bare: taken as it stands
	} {
		got, err := ParseKeyHeader(tc.in)
		if tc.bad {
			if !errors.Is(err, ErrKeyHeaderInvalid) {
				t.Errorf("ParseKeyHeader(%q) = %q, %v; want ErrKeyHeaderInvalid", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseKeyHeader(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
