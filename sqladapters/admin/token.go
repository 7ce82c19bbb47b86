package admin

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
)

const (
	// tokenCookie holds the browser's form token. Every mount of the
	// handler shares it, which is harmless: it only has to match the form.
	tokenCookie = "millbox_admin_token"
	// tokenField is the form field carrying the same value.
	tokenField = "token"
	tokenBytes = 32
)

// ensureToken returns the browser's form token, setting the cookie when
// the browser has none yet.
func ensureToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(tokenCookie); err == nil && wellFormed(c.Value) {
		return c.Value
	}
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // never fails
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name:     tokenCookie,
		Value:    v,
		Path:     "/",
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	return v
}

func wellFormed(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == tokenBytes
}

// validToken reports whether the form's token equals the cookie's.
func validToken(r *http.Request, form string) bool {
	c, err := r.Cookie(tokenCookie)
	if err != nil || !wellFormed(c.Value) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(c.Value), []byte(form)) == 1
}
