package secret

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
)

// NewHandler wraps h so that every record's message and every attribute
// (strings, errors, Stringers, anything printed, inside groups and in
// attributes given to With) reaches h redacted by r. Wrap the one handler
// a process logs through, and no package needs to remember redaction.
func NewHandler(h slog.Handler, r *Redactor) slog.Handler {
	return &handler{next: h, r: r}
}

type handler struct {
	next slog.Handler
	r    *Redactor
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = h.attr(a)
	}
	return &handler{next: h.next.WithAttrs(red), r: h.r}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{next: h.next.WithGroup(h.r.String(name)), r: h.r}
}

// attr redacts one attribute. Values that are neither strings nor groups
// are kept as they are unless their printed form holds something to
// redact; then the redacted text replaces them.
func (h *handler) attr(a slog.Attr) slog.Attr {
	a.Key = h.r.String(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(h.r.String(v.String()))
	case slog.KindGroup:
		group := v.Group()
		red := make([]slog.Attr, len(group))
		for i, g := range group {
			red[i] = h.attr(g)
		}
		a.Value = slog.GroupValue(red...)
	case slog.KindAny:
		a.Value = h.any(v)
	default:
		a.Value = v // numbers, durations, times, bools: nothing to hide
	}
	return a
}

func (h *handler) any(v slog.Value) slog.Value {
	var text string
	switch x := v.Any().(type) {
	case nil:
		return v
	case error:
		return slog.StringValue(h.r.String(x.Error()))
	case json.RawMessage:
		return slog.StringValue(string(h.r.JSON(x)))
	case []byte:
		return slog.StringValue(h.r.String(string(x)))
	case fmt.Stringer:
		return slog.StringValue(h.r.String(x.String()))
	default:
		text = fmt.Sprintf("%+v", x)
	}
	if red := h.r.String(text); red != text {
		return slog.StringValue(red)
	}
	return v
}
