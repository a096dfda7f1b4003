package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Every duration a log line carries has one form per format: seconds to
// the millisecond in JSON (never nanoseconds, never 1.1320000000000001),
// Go's form to the millisecond in text (never 65.306238ms).
func TestLogDurationsHaveOneForm(t *testing.T) {
	for _, tc := range []struct {
		d        time.Duration
		json     string
		text     string
		textNots string
	}{
		{1132 * time.Millisecond, `"duration":1.132`, "duration=1.132s", "1.1320000000000001"},
		{65306238 * time.Nanosecond, `"duration":0.065`, "duration=65ms", "65.306238ms"},
		{93 * time.Millisecond, `"duration":0.093`, "duration=93ms", "0.093"},
		{30 * time.Second, `"duration":30`, "duration=30s", "30000"},
	} {
		var js, text bytes.Buffer
		slog.New(slog.NewJSONHandler(&js, &slog.HandlerOptions{ReplaceAttr: durationsInSeconds})).Info("m", "duration", tc.d)
		slog.New(slog.NewTextHandler(&text, &slog.HandlerOptions{ReplaceAttr: durationsToTheMillisecond})).Info("m", "duration", tc.d)
		if !strings.Contains(js.String(), tc.json+"}") && !strings.Contains(js.String(), tc.json+",") {
			t.Errorf("%v in JSON: %s; want %s", tc.d, js.String(), tc.json)
		}
		if !strings.Contains(text.String(), tc.text+"\n") || strings.Contains(text.String(), tc.textNots) {
			t.Errorf("%v in text: %s; want %s", tc.d, text.String(), tc.text)
		}
	}
}
