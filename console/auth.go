package console

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
)

// maxUserRunes bounds a user name (the actor column holds console:<user>).
const maxUserRunes = 100

// authenticator names a request's user, or says why not (status 401 or
// 403 and a text for the user).
type authenticator interface {
	user(r *http.Request) (user string, status int, why string)
}

func newAuthenticator(cfg Config) (authenticator, error) {
	switch cfg.Auth {
	case AuthBasic:
		for u, hash := range cfg.Users {
			if err := ValidUser(u); err != nil {
				return nil, fmt.Errorf("console: user %q: %w", u, err)
			}
			if _, err := bcrypt.Cost(hash); err != nil {
				return nil, fmt.Errorf("console: user %s: not a bcrypt hash", u)
			}
		}
		b := &basicAuth{users: cfg.Users, ok: map[[32]byte]string{}, limit: newSignInLimit()}
		if _, err := rand.Read(b.salt[:]); err != nil {
			return nil, err
		}
		// Compared when the user is unknown, so that an unknown name
		// costs what a known one does (at the users' own cost).
		cost := bcrypt.DefaultCost
		for _, hash := range cfg.Users {
			cost, _ = bcrypt.Cost(hash)
			break
		}
		dummy, err := bcrypt.GenerateFromPassword([]byte("no such user"), cost)
		if err != nil {
			return nil, err
		}
		b.dummy = dummy
		return b, nil
	case AuthProxy:
		if cfg.ProxyHeader == "" {
			return nil, errors.New("console: auth proxy needs the header that names the user")
		}
		if len(cfg.ProxyCIDRs) == 0 {
			return nil, errors.New("console: auth proxy needs the proxy's addresses (CIDRs): a header from anyone else is not believed")
		}
		return proxyAuth{header: cfg.ProxyHeader, cidrs: cfg.ProxyCIDRs}, nil
	case AuthNone:
		if !cfg.Loopback {
			return nil, errors.New("console: auth none is refused unless the listener is loopback (127.0.0.1 or [::1]): use basic or proxy")
		}
		return noAuth{}, nil
	}
	return nil, fmt.Errorf("console: unknown auth %q (want basic, proxy or none)", cfg.Auth)
}

// ValidUser says whether name can be a console user: 1 to 100 printable
// characters, no spaces or colons (HTTP Basic splits at the first colon).
func ValidUser(name string) error {
	switch {
	case name == "":
		return errors.New("empty user name")
	case utf8.RuneCountInString(name) > maxUserRunes:
		return fmt.Errorf("user name longer than %d characters", maxUserRunes)
	case !utf8.ValidString(name):
		return errors.New("user name is not UTF-8")
	}
	for _, r := range name {
		if r == ':' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("user name holds %q: no spaces, colons or control characters", r)
		}
	}
	return nil
}

type basicAuth struct {
	users map[string][]byte
	dummy []byte
	// ok remembers credentials already checked against their hash (by a
	// salted digest, never the password), so that a page's requests do not
	// each cost a bcrypt comparison.
	salt [32]byte
	mu   sync.Mutex
	ok   map[[32]byte]string
	// limit bounds what failed sign-ins cost (signin_limit.go).
	limit *signInLimit
}

func (b *basicAuth) user(r *http.Request) (string, int, string) {
	name, pass, ok := r.BasicAuth()
	if !ok {
		return "", http.StatusUnauthorized, "sign in: the console needs a user name and password"
	}
	digest := sha256.Sum256(append(append(append(b.salt[:0:0], b.salt[:]...), name+"\x00"...), pass...))
	b.mu.Lock()
	known, hit := b.ok[digest]
	b.mu.Unlock()
	if hit && known == name {
		return name, 0, ""
	}
	addr := client(r)
	if b.limit.blocked(addr) {
		return "", http.StatusTooManyRequests, "too many failed sign-ins from your address: try again in a minute"
	}
	hash, exists := b.users[name]
	if !exists {
		// An unknown name costs what a known one does.
		hash = b.dummy
	}
	var err error
	if !b.limit.check(r.Context(), func() { err = bcrypt.CompareHashAndPassword(hash, []byte(pass)) }) {
		return "", http.StatusServiceUnavailable, "the sign-in was not checked before the request ended"
	}
	if !exists || err != nil {
		b.limit.fail(addr)
		return "", http.StatusUnauthorized, "wrong user name or password"
	}
	b.mu.Lock()
	if len(b.ok) > 10000 {
		clear(b.ok)
	}
	b.ok[digest] = name
	b.mu.Unlock()
	return name, 0, ""
}

type proxyAuth struct {
	header string
	cidrs  []netip.Prefix
}

func (p proxyAuth) user(r *http.Request) (string, int, string) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return "", http.StatusForbidden, "the console is reached through its proxy only"
	}
	addr = addr.Unmap()
	trusted := false
	for _, c := range p.cidrs {
		if c.Contains(addr) {
			trusted = true
			break
		}
	}
	if !trusted {
		return "", http.StatusForbidden, "the console is reached through its proxy only"
	}
	vals := r.Header.Values(p.header)
	if len(vals) != 1 || ValidUser(vals[0]) != nil {
		return "", http.StatusForbidden, "the proxy named no user (or more than one): sign in through the proxy"
	}
	return vals[0], 0, ""
}

type noAuth struct{}

func (noAuth) user(*http.Request) (string, int, string) { return LocalUser, 0, "" }

// ParseUsers reads a users file: one `name:bcrypt-hash` per line (the
// form `htpasswd -B` writes), blank lines and lines starting with # ignored.
// An error names the line.
func ParseUsers(r io.Reader) (map[string][]byte, error) {
	users := map[string][]byte{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: want name:bcrypt-hash", n)
		}
		if err := ValidUser(name); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if _, err := bcrypt.Cost([]byte(hash)); err != nil {
			return nil, fmt.Errorf("line %d: user %s: not a bcrypt hash (make one with htpasswd -nB %s)", n, name, name)
		}
		if _, dup := users[name]; dup {
			return nil, fmt.Errorf("line %d: user %s given twice", n, name)
		}
		users[name] = []byte(hash)
	}
	return users, sc.Err()
}
