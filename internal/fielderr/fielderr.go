// Package fielderr is the error a service's Validate returns for one of its
// settings: the configuration key the setting is read from, and what is
// wrong with it. internal/daemon maps each one back to `file:line: key`
// with config.ErrorAt; a service never needs to know where its settings
// were written.
package fielderr

import (
	"errors"
	"fmt"
)

// Error is one refused setting.
type Error struct {
	// Field is the configuration key ("reconcile.batch_size").
	Field string
	// Msg says what is wrong, without the key.
	Msg string
}

// New builds an Error for field.
func New(field, format string, args ...any) *Error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string { return e.Field + ": " + e.Msg }

// List collects field errors; Err returns them joined, or nil.
type List []error

// Add appends a field error.
func (l *List) Add(field, format string, args ...any) { *l = append(*l, New(field, format, args...)) }

// Err is errors.Join of the list (nil when empty).
func (l List) Err() error { return errors.Join(l...) }

// All unwraps err (one Error, or a join of them) into its field errors.
// An error that is not a field error comes back with ok false.
func All(err error) (errs []*Error, ok bool) {
	if err == nil {
		return nil, true
	}
	if fe, isField := err.(*Error); isField { //nolint:errorlint // only err itself: a wrapped *Error carries context that All must not drop
		return []*Error{fe}, true
	}
	j, isJoin := err.(interface{ Unwrap() []error })
	if !isJoin {
		return nil, false
	}
	for _, e := range j.Unwrap() {
		sub, ok := All(e)
		if !ok {
			return nil, false
		}
		errs = append(errs, sub...)
	}
	return errs, true
}
