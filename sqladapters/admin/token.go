package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
)

// Forms carry a token that is an HMAC, under the handler's key, of a
// random value the browser holds in a cookie of this page (and of the
// application's session cookie, when Config.SessionCookie names it). A
// cross-site request carries neither the cookie nor the token; a value
// planted in the cookie by a neighbouring site (cookie tossing) yields no
// token without the key; a token copied from another browser does not
// fit this one's cookie.
const (
	// cookieName holds the browser's value; over TLS it carries the
	// __Host- prefix, which tells the browser to keep it to this host,
	// path /, Secure, whatever a neighbour sets.
	cookieName = "millbox_admin"
	hostPrefix = "__Host-"
	// tokenField is the form field carrying the token.
	tokenField = "token"
	valueBytes = 32
	tokenLabel = "millbox admin form token\x00"
)

// secure reports whether the browser reaches the page over HTTPS.
func (h *handler) secure(r *http.Request) bool { return r.TLS != nil || h.cfg.BehindTLSProxy }

func (h *handler) cookieName(r *http.Request) string {
	if h.secure(r) {
		return hostPrefix + cookieName
	}
	return cookieName
}

// formToken returns the token the forms of the page carry, setting the
// cookie when the browser has none yet.
func (h *handler) formToken(w http.ResponseWriter, r *http.Request) string {
	name := h.cookieName(r)
	if c, err := r.Cookie(name); err == nil && wellFormedToken(c.Value) {
		return h.sign(r, c.Value)
	}
	b := make([]byte, valueBytes)
	_, _ = rand.Read(b) // never fails
	v := base64.RawURLEncoding.EncodeToString(b)
	c := &http.Cookie{
		Name:     name,
		Value:    v,
		Path:     "/",
		HttpOnly: true,
		Secure:   h.secure(r),
		SameSite: http.SameSiteStrictMode,
	}
	if !c.Secure {
		// Without the __Host- prefix, the cookie is kept to the path
		// the page is mounted at.
		c.Path = mountPath(r)
	}
	http.SetCookie(w, c)
	return h.sign(r, v)
}

// sign returns the token of the browser value v.
func (h *handler) sign(r *http.Request, v string) string {
	mac := hmac.New(sha256.New, h.key)
	mac.Write([]byte(tokenLabel))
	mac.Write([]byte(v))
	if h.cfg.SessionCookie != "" {
		mac.Write([]byte{0})
		if c, err := r.Cookie(h.cfg.SessionCookie); err == nil {
			mac.Write([]byte(c.Value))
		}
	}
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// validToken reports whether token was signed for this browser's cookie.
func (h *handler) validToken(r *http.Request, token string) bool {
	c, err := r.Cookie(h.cookieName(r))
	if err != nil || !wellFormedToken(c.Value) || !wellFormedToken(token) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(h.sign(r, c.Value)), []byte(token)) == 1
}

// wellFormedToken reports whether v has the form of a cookie value or a
// token: 32 bytes in unpadded URL-safe base64.
func wellFormedToken(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == valueBytes
}

// mountPath is the path the handler is mounted at, with a trailing
// slash: "/admin/" when http.StripPrefix("/admin") serves it.
func mountPath(r *http.Request) string {
	p := strings.TrimSuffix(requestPath(r), r.URL.Path)
	if !strings.HasPrefix(p, "/") {
		return "/"
	}
	return strings.TrimSuffix(p, "/") + "/"
}
