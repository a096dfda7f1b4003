package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Fingerprint returns the request_hash of a JSON request body: the hex
// SHA-256 of its canonical form, in which object keys are sorted and
// insignificant whitespace is gone, so neither changes the fingerprint.
// Numbers keep their literal text (1.0 and 1 differ), strings their exact
// value. An empty body fingerprints as JSON null.
func Fingerprint(body []byte) (string, error) {
	canon, err := Canonical(body)
	if err != nil {
		return "", err
	}
	return hashCanonical(canon), nil
}

// hashCanonical is the fingerprint of a body already in canonical form.
func hashCanonical(canon []byte) string {
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

// Canonical returns body in canonical JSON form (see Fingerprint).
func Canonical(body []byte) ([]byte, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return []byte("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: request body is not JSON: %v", ErrInvalid, err) //nolint:errorlint // ErrInvalid is the one cause callers branch on; the decoder's error is detail
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: request body holds more than one JSON value", ErrInvalid)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// encoding/json writes map keys sorted and json.Number verbatim.
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
