package console

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ledgerkeeper/ledgerkeeper/store"
)

// maxAttemptsFilter bounds the attempts filter to what a form can mean.
const maxAttemptsFilter = 1_000_000

// filterForm is a key filter as the keys page's query (or a bulk form)
// gives it: the values to carry on, and the store's filter built from them.
type filterForm struct {
	Tool, Status, Prefix, Held string
	Stuck                      bool
	// OlderThan: claimed at least this long ago ("2h", "90m"); "" any.
	OlderThan string
	// Attempts: at least this many probes of the current attempt; "" any.
	Attempts string
	f        store.KeyFilter
	// base is the console's path (Handler.base), for KeysURL.
	base string
}

// parseFilter reads a filter from a query or form; the error says which
// value is wrong, and how to write it.
func (h *Handler) parseFilter(v url.Values) (filterForm, error) {
	ff := filterForm{Tool: v.Get("tool"), Status: v.Get("status"), Prefix: v.Get("prefix"), Held: v.Get("held"),
		Stuck: v.Get("stuck") == "1", OlderThan: strings.TrimSpace(v.Get("older_than")), Attempts: strings.TrimSpace(v.Get("attempts")), base: h.base}
	ff.f = store.KeyFilter{Tool: ff.Tool, Status: ff.Status, Prefix: ff.Prefix, Stuck: ff.Stuck}
	switch ff.Held {
	case "":
	case "yes", "no":
		held := ff.Held == "yes"
		ff.f.Held = &held
	default:
		return ff, errors.New("held is yes, no or empty")
	}
	if utf8.RuneCountInString(ff.Prefix) > maxKeyRunes {
		return ff, errors.New("the key prefix is longer than a key (128 characters)")
	}
	if ff.OlderThan != "" {
		d, err := time.ParseDuration(ff.OlderThan)
		if err != nil || d <= 0 {
			return ff, fmt.Errorf("older than %q is not a positive duration (write it as 90s, 30m or 2h)", ff.OlderThan)
		}
		ff.f.OlderThan = d
	}
	if ff.Attempts != "" {
		n, err := strconv.Atoi(ff.Attempts)
		if err != nil || n < 1 || n > maxAttemptsFilter {
			return ff, fmt.Errorf("attempts %q is not a whole number from 1 (at least that many probes of the current attempt)", ff.Attempts)
		}
		ff.f.MinAttempts = n
	}
	if ff.Tool != "" && h.cfg.Windows != nil {
		ff.f.Window, ff.f.Heartbeat = h.cfg.Windows(ff.Tool)
	}
	return ff, nil
}

// values is the filter as query parameters (empty ones left out).
func (ff filterForm) values() url.Values {
	v := url.Values{}
	for name, s := range map[string]string{"tool": ff.Tool, "status": ff.Status, "prefix": ff.Prefix, "held": ff.Held,
		"older_than": ff.OlderThan, "attempts": ff.Attempts} {
		if s != "" {
			v.Set(name, s)
		}
	}
	if ff.Stuck {
		v.Set("stuck", "1")
	}
	return v
}

// Describe is the filter in words, for the pages.
func (ff filterForm) Describe() string {
	var parts []string
	if ff.Tool != "" {
		parts = append(parts, "tool "+ff.Tool)
	}
	if ff.Status != "" {
		parts = append(parts, "status "+ff.Status)
	}
	if ff.Prefix != "" {
		parts = append(parts, "key prefix "+strconv.Quote(ff.Prefix))
	}
	switch ff.Held {
	case "yes":
		parts = append(parts, "held")
	case "no":
		parts = append(parts, "not held")
	}
	if ff.Stuck {
		parts = append(parts, "stuck")
	}
	if ff.OlderThan != "" {
		parts = append(parts, "claimed over "+ff.OlderThan+" ago")
	}
	if ff.Attempts != "" {
		parts = append(parts, "probed at least "+ff.Attempts+" time(s)")
	}
	if len(parts) == 0 {
		return "every key"
	}
	return strings.Join(parts, ", ")
}

// Fields are the filter's hidden form fields.
func (ff filterForm) Fields() map[string]string {
	m := map[string]string{}
	for k, v := range ff.values() {
		m[k] = v[0]
	}
	return m
}

// KeysURL is the keys page of the filter.
func (ff filterForm) KeysURL() string { return ff.base + "keys?" + ff.values().Encode() }
