package settings

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
)

type inner struct {
	Floor   time.Duration `yaml:"floor" default:"1m"`
	Ceiling time.Duration `yaml:"ceiling" default:"30m"`
}

func (in *inner) CheckSettings(r *Report) {
	if in.Ceiling < in.Floor {
		r.Field(&in.Ceiling, "must not be shorter than %s (%s)", Ref(&in.Floor), in.Floor)
	}
}

type section struct {
	Size    int            `yaml:"size" default:"100" min:"0" max:"10000"`
	Ratio   float64        `yaml:"ratio" default:"0.2" min:"0.01"`
	Level   string         `yaml:"level" default:"info" oneof:"debug info warn"`
	On      bool           `yaml:"on"`
	Inner   inner          `yaml:"inner"`
	Ptr     *inner         `yaml:"ptr"`
	Tools   map[string]int `yaml:"tools"`
	Each    map[string]inner
	List    []inner  `yaml:"list"`
	Wiring  int      `yaml:"-" default:"7" min:"0"`
	private int      //nolint:unused // an unexported field is skipped
	Named   string   `yaml:"named,omitempty" default:"x"`
	Stopped []string `yaml:"stopped"`
}

func TestApplyDefaultsFillsZeroFieldsOnly(t *testing.T) {
	s := section{Size: 5, Ptr: &inner{Floor: time.Second}, Each: map[string]inner{"a": {}}, List: []inner{{Ceiling: time.Hour}}}
	ApplyDefaults(&s)
	want := section{
		Size: 5, Ratio: 0.2, Level: "info",
		Inner:  inner{Floor: time.Minute, Ceiling: 30 * time.Minute},
		Ptr:    &inner{Floor: time.Second, Ceiling: 30 * time.Minute},
		Each:   map[string]inner{"a": {Floor: time.Minute, Ceiling: 30 * time.Minute}},
		List:   []inner{{Floor: time.Minute, Ceiling: time.Hour}},
		Wiring: 7, Named: "x",
	}
	if s.Size != want.Size || s.Ratio != want.Ratio || s.Level != want.Level || s.Inner != want.Inner ||
		*s.Ptr != *want.Ptr || s.Each["a"] != want.Each["a"] || s.List[0] != want.List[0] ||
		s.Wiring != want.Wiring || s.Named != want.Named || s.On {
		t.Fatalf("ApplyDefaults = %+v (ptr %+v), want %+v (ptr %+v)", s, *s.Ptr, want, *want.Ptr)
	}
	again := s
	ApplyDefaults(&again)
	if again.Size != s.Size || again.Inner != s.Inner {
		t.Fatal("ApplyDefaults is not idempotent")
	}
}

func TestApplyDefaultsPanicsOnABadTag(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "default tag") {
			t.Fatalf("recovered %v, want a panic naming the default tag", r)
		}
	}()
	var bad struct {
		N int `default:"ten"`
	}
	ApplyDefaults(&bad)
}

func errsOf(fes []*fielderr.Error) []string {
	var out []string
	for _, fe := range fes {
		out = append(out, fe.Field+": "+fe.Msg)
	}
	slices.Sort(out)
	return out
}

func TestCheck(t *testing.T) {
	valid := func() section {
		s := section{Ptr: &inner{}, Each: map[string]inner{"a": {}}, List: []inner{{}}}
		ApplyDefaults(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		edit func(*section)
		want []string
	}{
		{"defaults hold", func(*section) {}, nil},
		{"at the bounds", func(s *section) { s.Size = 10000; s.Ratio = 0.01 }, nil},
		{"zero is not below min 0", func(s *section) { s.Size = 0 }, nil},
		{"below min 0", func(s *section) { s.Size = -1 }, []string{"size: must be positive, got -1"}},
		{"above max", func(s *section) { s.Size = 10001 }, []string{"size: at most 10000, got 10001"}},
		{"below a float min", func(s *section) { s.Ratio = 0.001 }, []string{"ratio: must be at least 0.01, got 0.001"}},
		{"not one of", func(s *section) { s.Level = "loud" }, []string{`level: must be debug, info or warn, got "loud"`}},
		{"a nested struct's rule", func(s *section) { s.Inner.Ceiling = time.Second },
			[]string{"inner.ceiling: must not be shorter than inner.floor (1m0s)"}},
		{"behind a pointer", func(s *section) { s.Ptr.Ceiling = time.Second },
			[]string{"ptr.ceiling: must not be shorter than ptr.floor (1m0s)"}},
		{"in a map, named by its key", func(s *section) { s.Each["a"] = inner{Floor: time.Hour, Ceiling: time.Minute} },
			[]string{"each.a.ceiling: must not be shorter than each.a.floor (1h0m0s)"}},
		{"in a list, named by its index", func(s *section) { s.List[0].Ceiling = time.Second },
			[]string{"list[0].ceiling: must not be shorter than list[0].floor (1m0s)"}},
		{"wiring is not judged", func(s *section) { s.Wiring = -5 }, nil},
		{"every refusal at once", func(s *section) { s.Size = -1; s.Level = ""; s.Inner.Ceiling = 0 }, []string{
			"inner.ceiling: must not be shorter than inner.floor (1m0s)",
			`level: must be debug, info or warn, got ""`,
			"size: must be positive, got -1",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := valid()
			tc.edit(&s)
			if got := errsOf(Check(&s)); !slices.Equal(got, tc.want) {
				t.Fatalf("Check = %q, want %q", got, tc.want)
			}
		})
	}
}

type keyed struct {
	Tools map[string]int `yaml:"tools"`
}

func (k *keyed) CheckSettings(r *Report) {
	for name, n := range k.Tools {
		if n < 0 {
			r.Key("tools."+name, "must be positive, got %d", n)
		}
	}
}

func TestCheckKeyNamesMapEntriesRelativeToTheStruct(t *testing.T) {
	var outer struct {
		Section keyed `yaml:"section"`
	}
	outer.Section.Tools = map[string]int{"t": -1}
	if got := errsOf(Check(&outer)); !slices.Equal(got, []string{"section.tools.t: must be positive, got -1"}) {
		t.Fatalf("Check = %q", got)
	}
	if err := Validate(&outer); err == nil || !strings.Contains(err.Error(), "section.tools.t") {
		t.Fatalf("Validate = %v", err)
	}
	if fes, ok := fielderr.All(Validate(&outer)); !ok || len(fes) != 1 {
		t.Fatalf("Validate's error is not field errors: %v", fes)
	}
}
