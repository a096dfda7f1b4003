package config

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// MarshalJSON writes the configuration as `config check` prints it: every
// setting under its key in the file (a field's json name where it has
// one, else its yaml name; `yaml:"-"` fields are wiring and left out),
// durations as "30s", secrets masked by their own MarshalJSON. The
// services' sections (reconcile.Config, expiry.Config) carry only yaml
// tags: their one name is the file's.
func (c *Config) MarshalJSON() ([]byte, error) {
	out := effective(reflect.ValueOf(c).Elem(), true)
	if m, ok := out.(map[string]any); ok && c.Fleet() {
		// Each ledger as it runs: the top level's settings with its own
		// over them.
		ls := map[string]any{}
		for _, l := range c.ledgers {
			ls[l.Name] = effective(reflect.ValueOf(l.Config).Elem(), true)
		}
		m["ledgers"] = ls
	}
	return json.Marshal(out)
}

var jsonMarshalerType = reflect.TypeOf((*json.Marshaler)(nil)).Elem()

// effective is v as JSON would print it by the file's key names.
func effective(v reflect.Value, root bool) any {
	if !root && v.Type().Implements(jsonMarshalerType) && (v.Kind() != reflect.Pointer || !v.IsNil()) {
		return v.Interface()
	}
	if v.Type() == timeDurationType {
		return time.Duration(v.Int()).String()
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return effective(v.Elem(), false)
	case reflect.Struct:
		out := map[string]any{}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, omitEmpty, ok := printedName(f)
			if !ok || (omitEmpty && v.Field(i).IsZero()) {
				continue
			}
			out[name] = effective(v.Field(i), false)
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := map[string]any{}
		it := v.MapRange()
		for it.Next() {
			out[fmt.Sprint(it.Key().Interface())] = effective(it.Value(), false)
		}
		return out
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = effective(v.Index(i), false)
		}
		return out
	default:
		return v.Interface()
	}
}

// printedName is a field's key: its json name when tagged, else its yaml
// name; ok is false for a field that is not a setting.
func printedName(f reflect.StructField) (name string, omitEmpty, ok bool) {
	if !f.IsExported() {
		return "", false, false
	}
	y, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if y == "-" || y == "" {
		return "", false, false
	}
	if j, has := f.Tag.Lookup("json"); has {
		n, opts, _ := strings.Cut(j, ",")
		if n == "-" {
			return "", false, false
		}
		return n, strings.Contains(opts, "omitempty"), true
	}
	return y, false, true
}
