// Package settings gives a configuration struct its defaults and its
// checks from the struct itself, so that a setting is one field with its
// default and its validation beside it:
//
//	// Grace is added to each processing window.
//	Grace time.Duration `yaml:"grace" default:"10s"`
//	// BatchSize is the number of keys leased per query.
//	BatchSize int `yaml:"batch_size" default:"100" min:"0" max:"10000"`
//
// ApplyDefaults fills every zero field from its `default` tag (written as
// the configuration file writes it: "10s", "100", "0.2", "info"); Check
// judges the `min`, `max` and `oneof` tags and calls the CheckSettings
// method of every struct that has one (rules across fields), and names
// each refused setting by its path of `yaml` names relative to the value
// checked ("breaker.max_cooldown"). A service therefore declares its
// settings once and never knows where its section sits in the file:
// internal/config, which owns the file's layout, prefixes the section's
// key and finds the line.
//
// Struct tags are the idea of Alertmanager's DefaultConfig beside the
// field and of go-playground/validator's range tags, kept to what our
// settings need: a tag that does not parse for its field is a programming
// error and panics (internal/daemon's TestEmptyFileIsDefaults applies
// every tag of the file's sections).
package settings

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
)

var durationType = reflect.TypeOf(time.Duration(0))

// ApplyDefaults sets every zero field of the struct v points to (and of
// the structs it holds: nested, behind non-nil pointers, in maps and
// slices) to its `default` tag. Zero means "not set": an operator who
// writes `batch_size: 0` gets the default, as the README says.
func ApplyDefaults(v any) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("settings: ApplyDefaults needs a non-nil pointer")
	}
	applyDefaults(rv.Elem())
}

func applyDefaults(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			applyDefaults(v.Elem())
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			fv := v.Field(i)
			if def, ok := f.Tag.Lookup("default"); ok && fv.IsZero() {
				if err := parseInto(fv, def); err != nil {
					panic(fmt.Sprintf("settings: %s.%s: default tag %q: %v", t, f.Name, def, err))
				}
			}
			applyDefaults(fv)
		}
	case reflect.Map:
		if v.Type().Elem().Kind() != reflect.Struct && v.Type().Elem().Kind() != reflect.Pointer {
			return
		}
		it := v.MapRange()
		for it.Next() {
			// A map's values are not addressable: default a copy and put
			// it back.
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(it.Value())
			applyDefaults(e)
			v.SetMapIndex(it.Key(), e)
		}
	case reflect.Slice:
		for i := range v.Len() {
			applyDefaults(v.Index(i))
		}
	default:
	}
}

// parseInto sets v from its text as the configuration file writes it.
func parseInto(v reflect.Value, s string) error {
	if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
		return u.UnmarshalText([]byte(s))
	}
	if v.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Int, reflect.Int64, reflect.Int32:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		v.SetInt(n)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		v.SetFloat(f)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		v.SetBool(b)
	default:
		return fmt.Errorf("no default for a field of type %s", v.Type())
	}
	return nil
}

// Checker is a settings struct with rules across its fields (a maximum
// that must not be below a minimum). Check calls CheckSettings after the
// field tags are judged, on the struct as it stands (defaults applied by
// the caller).
type Checker interface {
	CheckSettings(r *Report)
}

// Report collects one struct's refusals for Check.
type Report struct {
	root reflect.Value // the struct CheckSettings runs on
	errs []refusal
}

type refusal struct {
	ptr    any    // the field refused, or nil
	path   string // or its path relative to the struct
	format string
	args   []any // a Ref among them prints as its field's path
}

// Field refuses the field ptr points to (a field of the struct whose
// CheckSettings runs, at any depth): Check names it by its yaml path.
func (r *Report) Field(ptr any, format string, args ...any) {
	r.errs = append(r.errs, refusal{ptr: ptr, format: format, args: args})
}

// Key refuses the setting at a yaml path relative to the struct, for
// entries a pointer cannot reach (a map's values).
func (r *Report) Key(path, format string, args ...any) {
	r.errs = append(r.errs, refusal{path: path, format: format, args: args})
}

// Ref is an argument of Field or Key that prints as the path of the field
// ptr points to, as Check names it ("reconcile.breaker.cooldown" when the
// whole file is checked): a message can name the other setting of a rule
// without the struct knowing where it sits.
func Ref(ptr any) any { return ref{ptr} }

type ref struct{ ptr any }

// Check judges the struct v points to and everything it holds: each
// field's `min`, `max` and `oneof` tags, then each struct's CheckSettings.
// Fields tagged `yaml:"-"` are not settings and are not judged. Every
// refusal is a *fielderr.Error whose Field is the yaml path relative to
// v; all of them are returned (nil: none).
func Check(v any) []*fielderr.Error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("settings: Check needs a non-nil pointer")
	}
	var out []*fielderr.Error
	check(rv.Elem(), "", &out)
	return out
}

// Validate is Check as one error (errors.Join of the field errors), for a
// service's Validate method.
func Validate(v any) error {
	var l fielderr.List
	for _, e := range Check(v) {
		l = append(l, e)
	}
	return l.Err()
}

func join(base, key string) string {
	if base == "" {
		return key
	}
	return base + "." + key
}

// yamlName is a field's key in the file ("" for none: not a setting).
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" || !f.IsExported() {
		return ""
	}
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

func check(v reflect.Value, path string, out *[]*fielderr.Error) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			check(v.Elem(), path, out)
		}
		return
	case reflect.Map:
		if k := v.Type().Elem().Kind(); k != reflect.Struct && k != reflect.Pointer {
			return
		}
		it := v.MapRange()
		for it.Next() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(it.Value())
			check(e, join(path, fmt.Sprint(it.Key().Interface())), out)
		}
		return
	case reflect.Slice:
		for i := range v.Len() {
			check(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
		return
	case reflect.Struct:
	default:
		return
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		fv, p := v.Field(i), join(path, name)
		if msg := checkTags(f, fv); msg != "" {
			*out = append(*out, fielderr.New(p, "%s", msg))
		}
		check(fv, p, out)
	}
	if !v.CanAddr() {
		c := reflect.New(t).Elem()
		c.Set(v)
		v = c
	}
	c, ok := v.Addr().Interface().(Checker)
	if !ok {
		return
	}
	r := &Report{root: v}
	c.CheckSettings(r)
	locate := func(ptr any) string {
		rel, found := pathOf(v, reflect.ValueOf(ptr), "")
		if !found {
			panic(fmt.Sprintf("settings: %s.CheckSettings named a pointer that is not one of its fields", t))
		}
		return join(path, rel)
	}
	for _, e := range r.errs {
		at := join(path, e.path)
		if e.ptr != nil {
			at = locate(e.ptr)
		}
		args := slices.Clone(e.args)
		for i, a := range args {
			if rf, isRef := a.(ref); isRef {
				args[i] = locate(rf.ptr)
			}
		}
		*out = append(*out, fielderr.New(at, e.format, args...))
	}
}

// pathOf finds the field of v (at any depth through structs and non-nil
// pointers) that ptr points to, by address and type.
func pathOf(v reflect.Value, ptr reflect.Value, path string) (string, bool) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "", false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return "", false
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name := yamlName(f)
		if name == "" {
			continue
		}
		fv := v.Field(i)
		if fv.Addr().Pointer() == ptr.Pointer() && fv.Type() == ptr.Type().Elem() {
			return join(path, name), true
		}
		if p, ok := pathOf(fv, ptr, join(path, name)); ok {
			return p, true
		}
	}
	return "", false
}

// checkTags judges one field's min, max and oneof tags ("" when they
// hold).
func checkTags(f reflect.StructField, v reflect.Value) string {
	if lo, ok := f.Tag.Lookup("min"); ok {
		if below(v, lo) {
			if lo == "0" {
				return fmt.Sprintf("must be positive, got %v", v.Interface())
			}
			return fmt.Sprintf("must be at least %s, got %v", lo, v.Interface())
		}
	}
	if hi, ok := f.Tag.Lookup("max"); ok {
		if above(v, hi) {
			return fmt.Sprintf("at most %s, got %v", hi, v.Interface())
		}
	}
	if set, ok := f.Tag.Lookup("oneof"); ok && v.Kind() == reflect.String {
		opts := strings.Fields(set)
		for _, o := range opts {
			if v.String() == o {
				return ""
			}
		}
		return fmt.Sprintf("must be %s, got %q", orList(opts), v.String())
	}
	return ""
}

func orList(opts []string) string {
	if len(opts) == 1 {
		return opts[0]
	}
	return strings.Join(opts[:len(opts)-1], ", ") + " or " + opts[len(opts)-1]
}

func below(v reflect.Value, bound string) bool { return compare(v, bound) < 0 }
func above(v reflect.Value, bound string) bool { return compare(v, bound) > 0 }

// compare orders a numeric field against a bound written as the file
// writes it.
func compare(v reflect.Value, bound string) int {
	b := reflect.New(v.Type()).Elem()
	if err := parseInto(b, bound); err != nil {
		panic(fmt.Sprintf("settings: bound %q for a field of type %s: %v", bound, v.Type(), err))
	}
	switch v.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return cmpOrdered(v.Int(), b.Int())
	case reflect.Float64:
		return cmpOrdered(v.Float(), b.Float())
	default:
		panic(fmt.Sprintf("settings: min/max on a field of type %s", v.Type()))
	}
}

func cmpOrdered[T int64 | float64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
