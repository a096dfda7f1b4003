package reconcile

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// madeUpRequest returns a request body of the same shape as a real one
// whose every string and number is made up, so that a probe which addresses
// effects by request fields ({request.order_id}, an sql arg) asks about a
// request nobody made. Strings keep their form where a downstream may
// validate it (a UUID stays a UUID, digits stay digits of the same length).
func madeUpRequest(real json.RawMessage) json.RawMessage {
	if len(real) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(real))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	out, err := json.Marshal(scramble(v))
	if err != nil {
		return nil
	}
	return out
}

func scramble(v any) any {
	switch x := v.(type) {
	case string:
		return madeUpString(x)
	case json.Number:
		return json.Number(madeUpDigits(max(len(strings.TrimLeft(string(x), "-")), 9)))
	case []any:
		for i := range x {
			x[i] = scramble(x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = scramble(x[k])
		}
	}
	return v
}

func madeUpString(s string) string {
	switch {
	case isUUID(s):
		b := []byte(randomHex(16))
		return fmt.Sprintf("%s-%s-4%s-a%s-%s", b[0:8], b[8:12], b[13:16], b[17:20], b[20:32])
	case s != "" && strings.Trim(s, "0123456789") == "":
		return madeUpDigits(len(s))
	}
	return "ledgerkeeper-self-check-" + randomHex(8)
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
	}
	return true
}

// madeUpDigits returns n random digits, the first not 0.
func madeUpDigits(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = '0' + b[i]%10
	}
	if b[0] == '0' {
		b[0] = '9'
	}
	return string(b)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
