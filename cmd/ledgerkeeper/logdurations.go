package main

import (
	"log/slog"
	"time"
)

// durationsInSeconds is the JSON log handler's ReplaceAttr: a
// time.Duration attribute is written as a number of seconds (a float, to
// the millisecond), not slog's default integer nanoseconds. Text logs keep
// Go's "1.5s".
func durationsInSeconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, a.Value.Duration().Round(time.Millisecond).Seconds())
	}
	return a
}
