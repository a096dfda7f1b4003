package probes

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRenderURL(t *testing.T) {
	t.Parallel()
	k := Key{Key: "a/b?c#d%e f", Tool: "create_ticket", RequestBody: json.RawMessage(`{"acc":"x&y=z","n":42,"items":[{"sku":"s/1"}]}`)}
	tests := []struct {
		tmpl, want string
	}{
		{"http://h/v1/{key}", "http://h/v1/a%2Fb%3Fc%23d%25e%20f"},
		{"http://h/v1?k={key}", "http://h/v1?k=a%2Fb%3Fc%23d%25e+f"},
		{"https://h:8443/t/{tool}/x-{key}-y?acc={request.acc}&n={request.n}", "https://h:8443/t/create_ticket/x-a%2Fb%3Fc%23d%25e%20f-y?acc=x%26y%3Dz&n=42"},
		{"http://h/s/{request.items.0.sku}", "http://h/s/s%2F1"},
		{"http://[::1]:80/{key}", "http://[::1]:80/a%2Fb%3Fc%23d%25e%20f"},
		{"http://h", "http://h"},
		{"http://h?k={key}", "http://h?k=a%2Fb%3Fc%23d%25e+f"},
		{"http://h/a%20b/{tool}", "http://h/a%20b/create_ticket"},
	}
	for _, tt := range tests {
		tmpl, err := parseURLTemplate(tt.tmpl)
		if err != nil {
			t.Errorf("%s: %v", tt.tmpl, err)
			continue
		}
		u, err := tmpl.render(k)
		if err != nil {
			t.Errorf("%s: render: %v", tt.tmpl, err)
			continue
		}
		if got := u.String(); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.tmpl, got, tt.want)
		}
	}
}

func TestEscapePathValue(t *testing.T) {
	t.Parallel()
	in := "AZaz09-._~ /?#%;,:@&=+$!'()*[]\x00\x7fé"
	got := escapePathValue(in)
	if strings.Trim(got, "AZaz09-._~%0123456789ABCDEF") != "" {
		t.Errorf("escapePathValue left reserved characters: %q", got)
	}
	if !strings.HasPrefix(got, "AZaz09-._~%20%2F%3F%23%25") {
		t.Errorf("escapePathValue(%q) = %q", in, got)
	}
}
