package probes

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ledgerkeeper/ledgerkeeper/internal/fielderr"
)

// CheckHTTPSettings names the setting of each mistake in cfg that NewHTTP
// would refuse or that would make every probe unknown, as *fielderr.Error
// with the probe's own keys ("url", "method", "match",
// "response_body.FIELD", "response_code", "timeout", "not_found_on_404",
// "not_found_body", "not_found_body.path", "not_found_body.equals"), all
// of them joined.
// Zero means the default. `config check` calls it (through
// internal/daemon) so that each error has the key's own line; NewHTTP
// still refuses whatever it cannot build.
func CheckHTTPSettings(cfg HTTPConfig) error {
	errs := answerSettings(cfg.Match, cfg.ResponseCode, cfg.ResponseBody)
	if cfg.Timeout < 0 {
		errs.Add("timeout", "must be positive")
	}
	if cfg.URL == "" {
		errs.Add("url", "required for an http probe")
	} else if err := checkURLHost(cfg.URL); err != nil {
		errs.Add("url", "%v", err)
	}
	switch m := strings.ToUpper(cfg.Method); m {
	case "", "GET", "POST", "HEAD":
	default:
		errs.Add("method", "must be GET, POST or HEAD, got %q", cfg.Method)
	}
	switch cfg.NotFoundOn404 {
	case "", NotFoundOn404JSON, NotFoundOn404Any:
	default:
		errs.Add("not_found_on_404", "must be json or any, got %q", cfg.NotFoundOn404)
	}
	if nb := cfg.NotFoundBody; nb != nil {
		switch {
		case cfg.NotFoundOn404 == NotFoundOn404Any:
			errs.Add("not_found_body", "contradicts not_found_on_404: any, which counts every 404 whatever its body: remove one")
		case strings.EqualFold(cfg.Method, "HEAD"):
			errs.Add("not_found_body", "a HEAD response has no body: remove not_found_body or use GET")
		}
		if nb.Path == "" {
			errs.Add("not_found_body.path", "required: the dotted path of the member that says the effect is absent, e.g. error.code")
		} else if _, err := parseMatchPath(nb.Path); err != nil {
			errs.Add("not_found_body.path", "%v", err)
		}
		if nb.Equals == "" {
			errs.Add("not_found_body.equals", "required: what the member at path holds in the API's own 404, e.g. ticket_not_found")
		}
	}
	return errs.Err()
}

// CheckSQLSettings is CheckHTTPSettings for an sql probe: "database_url",
// "query", "args[i]", "response_body.FIELD", "response_code", "timeout".
// It does not connect (Check does).
func CheckSQLSettings(cfg SQLConfig) error {
	errs := answerSettings("", cfg.ResponseCode, cfg.ResponseBody)
	if cfg.Timeout < 0 {
		errs.Add("timeout", "must be positive")
	}
	if cfg.DatabaseURL == "" {
		errs.Add("database_url", "required for a sql probe (or database_url_file)")
	} else if err := CheckExecMode(cfg.DatabaseURL); err != nil {
		errs.Add("database_url", "%v", err)
	}
	if strings.TrimSpace(cfg.Query) == "" {
		errs.Add("query", "required for a sql probe")
	} else if err := CheckQuery(cfg.Query); err != nil {
		errs.Add("query", "%v", err)
	}
	for i, a := range cfg.Args {
		if a != "key" && a != "tool" && !strings.HasPrefix(a, "request.") {
			errs.Add(fmt.Sprintf("args[%d]", i), "must be key, tool or request.PATH, got %q", a)
		}
	}
	return errs.Err()
}

// CheckAnswerSettings judges the settings that map an answer to an outcome,
// whatever the probe: "match", "response_body.FIELD" (dotted paths, not
// JSONPath or JSON Pointer spellings, which would name members no answer
// has) and "response_code".
func CheckAnswerSettings(match string, code int, body map[string]string) error {
	errs := answerSettings(match, code, body)
	return errs.Err()
}

func answerSettings(match string, code int, body map[string]string) fielderr.List {
	var errs fielderr.List
	if err := CheckPathSpelling(match); err != nil {
		errs.Add("match", "%v", err)
	}
	for _, field := range slices.Sorted(maps.Keys(body)) {
		if err := CheckPathSpelling(body[field]); err != nil {
			errs.Add("response_body."+field, "%v", err)
		}
	}
	if code != 0 && (code < 100 || code > 599) {
		errs.Add("response_code", "must be an HTTP status code, got %d", code)
	}
	return errs
}

// checkURLHost accepts http(s) URLs whose scheme and host are literal:
// placeholders may stand only in the path and query. NewHTTP's template
// parser refuses the rest.
func checkURLHost(tmpl string) error {
	scheme, rest, ok := strings.Cut(tmpl, "://")
	if !ok || (scheme != "http" && scheme != "https") {
		return fmt.Errorf("must start with http:// or https://")
	}
	host := rest
	if hostEnd := strings.IndexAny(rest, "/?#"); hostEnd >= 0 {
		host = rest[:hostEnd]
	}
	if host == "" {
		return fmt.Errorf("has no host")
	}
	if strings.ContainsAny(host, "{}@") {
		return fmt.Errorf("host %q must be literal (no placeholders, no credentials)", host)
	}
	return nil
}
