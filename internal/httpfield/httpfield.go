// Package httpfield holds the syntax rules of HTTP header fields and
// request targets that both the configuration checks and the http handler
// apply, so that a configuration that passes the checks is one the handler
// can send.
package httpfield

import (
	"net/http"
	"strings"
)

// Reserved says why a configured header may not be set, or "" if
// it may: the transport writes the framing and connection fields, and the
// Streamd- prefix is the delivery's own.
func Reserved(name string) string {
	switch c := http.CanonicalHeaderKey(name); c {
	case "Content-Length", "Transfer-Encoding", "Trailer", "Te", "Connection", "Keep-Alive",
		"Upgrade", "Proxy-Connection", "Proxy-Authorization":
		return c + " is written by streamd's HTTP transport"
	default:
		if strings.HasPrefix(c, "Streamd-") {
			return "the Streamd- prefix is reserved for the headers streamd sends with each record"
		}
	}
	return ""
}

// ValidRequestTarget reports whether a request-target can go on the request
// line as it is: printable ASCII without spaces.
func ValidRequestTarget(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// TokenByte reports whether c is an HTTP token character (RFC 9110
// §5.6.2).
func TokenByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// ValidValue reports whether v is a valid HTTP field value: no control
// characters but tab.
func ValidValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// ValidHost reports whether v can be sent as a Host field: the bytes
// of a host (a name, an IPv4 address or a bracketed IPv6 one) and a port
// (RFC 9110 §7.2, RFC 3986 §3.2.2).
func ValidHost(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("-._~!$&'()*+,;=:[]%", c) >= 0) {
			return false
		}
	}
	return v != ""
}

// ValidName reports whether name is an HTTP field name: a token of
// RFC 9110 §5.6.2.
func ValidName(name string) bool {
	for i := 0; i < len(name); i++ {
		if !TokenByte(name[i]) {
			return false
		}
	}
	return name != ""
}
