package main

import (
	"log/slog"
	"time"
)

// durationsInSeconds is the JSON log handler's ReplaceAttr: a
// time.Duration attribute is written as a number of seconds to the
// millisecond (1.132, never slog's integer nanoseconds, nor
// Duration.Seconds' 1.1320000000000001).
func durationsInSeconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, float64(a.Value.Duration().Round(time.Millisecond).Milliseconds())/1000)
	}
	return a
}

// durationsToTheMillisecond is the text log handler's ReplaceAttr: a
// time.Duration attribute is written in Go's form rounded to the
// millisecond ("65.306ms", "1.5s"), the one form of every duration in a
// text log.
func durationsToTheMillisecond(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Duration(a.Key, a.Value.Duration().Round(time.Millisecond))
	}
	return a
}
