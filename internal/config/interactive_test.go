package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// alerts.slack.operators takes the shorthand (a name) and the long form
// (name and actions) side by side; the keys' lines are known for Settle's
// errors.
func TestSlackOperatorsShorthandAndLongForm(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("lk.yaml", []byte(`alerts:
  slack:
    interactive: true
    token: xoxb-1
    channel: "#c"
    operators:
      U012ABC: alice
      W0ENTERPRISE:
        name: bob
        actions: [inspect, hold]
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Alerts.Slack
	if !s.Interactive {
		t.Error("interactive not decoded")
	}
	if got := s.Operators["U012ABC"]; got.Name != "alice" || len(got.Actions) != 0 {
		t.Errorf("shorthand decoded to %+v", got)
	}
	if got := s.Operators["W0ENTERPRISE"]; got.Name != "bob" || !slices.Equal(got.Actions, []string{"inspect", "hold"}) {
		t.Errorf("long form decoded to %+v", got)
	}
	for path, line := range map[string]int{
		"alerts.slack.operators.U012ABC":              7,
		"alerts.slack.operators.U012ABC.name":         7,
		"alerts.slack.operators.W0ENTERPRISE.actions": 10,
	} {
		if e := cfg.ErrorAt(path, "x"); e.Line != line {
			t.Errorf("%s at line %d, want %d", path, e.Line, line)
		}
	}
}

// Wrong shapes and unknown keys under alerts.slack are file:line: key
// errors like everywhere else.
func TestSlackInteractiveDecodeErrors(t *testing.T) {
	t.Parallel()
	_, err := Parse("lk.yaml", []byte(`alerts:
  slack:
    interactive: yes-please
    operators:
      U012ABC: [alice]
      U999: {name: carol, actions: inspect}
      U777: {nmae: dave}
`), env(nil))
	if err == nil {
		t.Fatal("bad operators accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		`lk.yaml:3: alerts.slack.interactive: expected true or false, got "yes-please"`,
		`lk.yaml:5: alerts.slack.operators.U012ABC: expected a mapping, got a list`,
		`lk.yaml:6: alerts.slack.operators.U999.actions: expected a list, got "inspect"`,
		`lk.yaml:7: alerts.slack.operators.U777.nmae: unknown key (did you mean "name"?)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
}

// The app-level token and the signing secret are secrets: from ${VAR} or
// their *_file twins, registered with the redactor, masked in the
// effective settings; a value and its twin together are refused.
func TestSlackInteractiveSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	appFile := filepath.Join(dir, "app-token")
	if err := os.WriteFile(appFile, []byte("xapp-1-from-file-4242\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse("lk.yaml", []byte(fmt.Sprintf(`alerts:
  slack:
    token: xoxb-literal-bot-1111
    channel: "#c"
    interactive: true
    app_token_file: %q
    signing_secret: ${SIGNING}
    operators: {U012ABC: alice}
`, appFile)), env(map[string]string{"SIGNING": "signing-secret-from-env-5151"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Alerts.Slack.AppToken.Reveal(); got != "xapp-1-from-file-4242" {
		t.Errorf("app token from file: %q", got)
	}
	if got := cfg.Alerts.Slack.SigningSecret.Reveal(); got != "signing-secret-from-env-5151" {
		t.Errorf("signing secret from env: %q", got)
	}
	red := cfg.Redactor()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	shown := string(red.JSON(b)) + fmt.Sprintf("%v %+v", cfg.Alerts.Slack, cfg.Alerts.Slack)
	for _, s := range []string{"xapp-1-from-file-4242", "signing-secret-from-env-5151", "xoxb-literal-bot-1111"} {
		if strings.Contains(shown, s[len(s)-9:]) {
			t.Errorf("effective settings show %s: %s", s, shown)
		}
		if got := red.String("x " + s + " y"); strings.Contains(got, s[len(s)-9:]) {
			t.Errorf("%s not registered: %q", s, got)
		}
	}
	if !strings.Contains(shown, `"interactive":true`) || !strings.Contains(shown, `"U012ABC":{"name":"alice"}`) {
		t.Errorf("non-secret settings missing: %s", shown)
	}
	// Written into the file itself, they are no less secret.
	lit, err := Parse("lk.yaml", []byte("alerts:\n  slack:\n    app_token: xapp-literal-app-2323\n    signing_secret: literal-signing-3434\n"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := lit.Redactor().String("xapp-literal-app-2323 literal-signing-3434"); strings.Contains(got, "2323") || strings.Contains(got, "3434") {
		t.Errorf("literal secrets not registered: %q", got)
	}

	_, err = Parse("lk.yaml", []byte(fmt.Sprintf("alerts:\n  slack:\n    app_token: xapp-x\n    app_token_file: %q\n    signing_secret: s\n    signing_secret_file: %q\n", appFile, appFile)), env(nil))
	if err == nil || !strings.Contains(err.Error(), "lk.yaml:4: alerts.slack.app_token_file: set both the value and its _file twin") ||
		!strings.Contains(err.Error(), "lk.yaml:6: alerts.slack.signing_secret_file: set both") {
		t.Errorf("value and twin together: %v", err)
	}
	_, err = Parse("lk.yaml", []byte("alerts:\n  slack:\n    signing_secret_file: /nonexistent/signing\n"), env(nil))
	if err == nil || !strings.Contains(err.Error(), "lk.yaml:3: alerts.slack.signing_secret_file: cannot read secret file") {
		t.Errorf("unreadable twin: %v", err)
	}
}
