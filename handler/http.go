package handler

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/internal/h1"
	"github.com/streamd/streamd/internal/httpfield"
)

// The request headers of the http handler, besides the delivery's metadata
// (see deliveryMeta). Every request also carries the configured headers
// and, with bearer_token_file, Authorization: Bearer.
const (
	// httpRecordHeaderPrefix carries a record header whose value is text:
	// empty, or printable ASCII (0x20 to 0x7e) that neither starts nor ends
	// with a space, which every HTTP stack passes on unchanged.
	httpRecordHeaderPrefix = "Streamd-Header-"
	// httpBase64RecordHeaderPrefix carries any other record header value
	// in standard base64 with padding. A record header
	// is sent under exactly one of the two prefixes, and the two never
	// collide: no name after Streamd-Header- can produce a
	// Streamd-Base64-Header- field.
	httpBase64RecordHeaderPrefix = "Streamd-Base64-Header-"

	// httpOutcomeHeader is the response header that names the outcome and
	// wins over the status code; see parseOutcomeDirective.
	httpOutcomeHeader = "Streamd-Outcome"
)

const (
	// httpMaxIdleConns keeps one idle connection per handler goroutine for
	// a subscription's concurrency up to this many.
	httpMaxIdleConns = 128
	// httpExcerptLimit bounds the body excerpt in a failure's error.
	httpExcerptLimit = 256
	// httpUserAgent is the User-Agent unless the headers set one.
	httpUserAgent = "streamd"
)

// httpHandler POSTs each payload to a URL.
//
// A record header travels as Streamd-Header-<name> when its value is text
// (see httpRecordHeaderPrefix), else as Streamd-Base64-Header-<name>.
// Header names in HTTP are case-insensitive and record header names are
// lowercase, so a receiver lowercases what follows the prefix. A byte of
// the name that is not an HTTP token character, and '%', is written as %XX
// (uppercase hex), so every record header name, even one with spaces,
// makes a valid field name and decodes back exactly.
//
// Content-Type is the record's content-type header when it has one whose
// value is text, else a Content-Type among the configured headers, else
// application/octet-stream. A configured Host header sets the request's
// Host, a configured User-Agent replaces "streamd". The configured headers
// cannot use the Streamd- prefix, nor name a field the transport writes
// (see httpfield.Reserved).
//
// The outcome:
//
//	Streamd-Outcome response header     what it names (an invalid value: failed)
//	2xx                                 ack
//	429 or 503                          failed, held for its Retry-After (delay-seconds or an HTTP-date)
//	                                    when it has a valid one, else for the next backoff step
//	408                                 failed
//	other 4xx                           drop
//	1xx, 3xx, 5xx                       failed (redirects are not followed)
//	timeout, transport error            failed
//	ctx ended (shutdown)                failed (cancelled)
//
// Failed carries the status with an excerpt of the body, or the transport
// error: the delivery failed, and the record is delivered again in place.
//
// All deliveries share one [h1.Client]: HTTP/1.1 on kept-alive connections,
// one per delivery in flight, up to 128 kept idle, each exchange done by
// the delivering goroutine. An http:// proxy named by $HTTP_PROXY,
// $HTTPS_PROXY and $NO_PROXY is used as net/http would; another kind of
// proxy is a configuration error. Close closes the idle connections.
type httpHandler struct {
	host        string // a configured Host header, or ""
	fixed       []byte // the configured header fields, Authorization and User-Agent, as written
	contentType []byte // the Content-Type unless the record has one
	timeout     time.Duration
	client      *h1.Client
}

func newHTTPHandler(cfg conf.Handler) (*httpHandler, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %w", errors.Unwrap(err)) // without the URL, which may hold a secret
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("url: use an http:// or https:// URL with a host")
	}
	if !httpfield.ValidRequestTarget(u.RequestURI()) {
		return nil, errors.New("url: the query holds a space, a control character or a byte beyond ASCII; percent-encode it")
	}
	h := &httpHandler{
		contentType: []byte("application/octet-stream"),
		timeout:     time.Duration(cmp.Or(cfg.Timeout, conf.DefaultHTTPTimeout)),
	}
	userAgent := httpUserAgent
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		value := strings.Trim(cfg.Headers[name], " \t")
		if !httpfield.ValidName(name) || !httpfield.ValidValue(value) {
			return nil, fmt.Errorf("headers.%s: not a valid HTTP header", name)
		}
		if why := httpfield.Reserved(name); why != "" {
			return nil, fmt.Errorf("headers.%s: %s", name, why)
		}
		switch http.CanonicalHeaderKey(name) {
		case "Host":
			if !httpfield.ValidHost(value) {
				return nil, fmt.Errorf("headers.%s: %q is not a host[:port]", name, value)
			}
			h.host = value
		case "Content-Type":
			h.contentType = []byte(value)
		case "User-Agent":
			userAgent = value
		default:
			h.fixed = appendHTTPField(h.fixed, http.CanonicalHeaderKey(name), "", value)
		}
	}
	h.fixed = appendHTTPField(h.fixed, "User-Agent", "", userAgent)
	if cfg.BearerTokenFile != "" {
		token, err := readBearerToken(cfg.BearerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("bearer_token_file: %w", err)
		}
		h.fixed = appendHTTPField(h.fixed, "Authorization", "", "Bearer "+token)
	}
	opts := h1.Options{URL: u, MaxIdle: httpMaxIdleConns}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: %s holds no PEM certificate", cfg.CAFile)
		}
		opts.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if opts.Proxy, err = http.ProxyFromEnvironment(&http.Request{URL: u}); err != nil {
		return nil, fmt.Errorf("the proxy of $HTTP_PROXY or $HTTPS_PROXY: %w", err)
	}
	if h.client, err = h1.New(opts); err != nil {
		return nil, fmt.Errorf("url: %w (a proxy from $HTTP_PROXY or $HTTPS_PROXY; $NO_PROXY can exempt the host)", err)
	}
	return h, nil
}

// readBearerToken reads a token file: one line of printable ASCII without
// spaces, with its trailing line ending removed.
func readBearerToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimRight(string(b), "\r\n")
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c >= 0x7f {
			return "", fmt.Errorf("%s: the token must be one line of printable ASCII without spaces", path)
		}
	}
	return token, nil
}

// Close closes the idle connections.
func (h *httpHandler) Close() error { return h.client.Close() }

// Handle POSTs d and maps the response to an outcome.
func (h *httpHandler) Handle(ctx context.Context, d *Delivery) Outcome {
	resp, err := h.client.Post(ctx, h.timeout, &h1.Request{
		Host:         h.host,
		AppendHeader: func(b []byte) []byte { return h.appendHeader(b, d) },
		Body:         d.Payload,
	})
	if err != nil {
		return h.transportFailure(ctx, err)
	}
	defer resp.Body.Close()
	return h.outcome(resp)
}

// appendHeader appends the header fields of d's request: the configured
// ones, the record's headers, Content-Type, and the metadata.
func (h *httpHandler) appendHeader(b []byte, d *Delivery) []byte {
	b = append(b, h.fixed...)
	contentType := h.contentType
	for _, e := range d.Headers {
		name := escapeHeaderName(e.Name)
		if !httpTextValue(e.Value) {
			b = append(b, httpBase64RecordHeaderPrefix...)
			b = append(b, name...)
			b = append(b, ": "...)
			b = base64.StdEncoding.AppendEncode(b, e.Value)
			b = append(b, "\r\n"...)
			continue
		}
		b = appendHTTPField(b, httpRecordHeaderPrefix, name, e.Value)
		if e.Name == "content-type" && len(e.Value) > 0 {
			contentType = e.Value
		}
	}
	b = appendHTTPField(b, "Content-Type", "", contentType)
	for _, m := range deliveryMeta {
		b = append(b, m.header...)
		b = append(b, ": "...)
		b = m.appendValue(b, d)
		b = append(b, "\r\n"...)
	}
	return b
}

// appendHTTPField appends the field "prefix+name: value\r\n"; both are
// valid already.
func appendHTTPField[V string | []byte](b []byte, prefix, name string, value V) []byte {
	b = append(b, prefix...)
	b = append(b, name...)
	b = append(b, ": "...)
	b = append(b, value...)
	return append(b, "\r\n"...)
}

// outcome maps a response to an outcome, as the httpHandler documentation
// tabulates.
func (h *httpHandler) outcome(resp *http.Response) Outcome {
	if v, ok := resp.Header[httpOutcomeHeader]; ok {
		o, err := parseOutcomeDirective(v[0])
		if err != nil {
			return Failed(FailureOther, fmt.Errorf("http: %s response header: %w", httpOutcomeHeader, err))
		}
		return o
	}
	switch code := resp.StatusCode; {
	case code >= 200 && code <= 299:
		return Outcome{Kind: OutcomeAck}
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		o := Failed(FailureHTTPStatus, statusError(resp, ""))
		if v := resp.Header.Get("Retry-After"); v != "" {
			d, ok := parseRetryAfter(v, time.Now())
			if !ok {
				return Failed(FailureHTTPStatus, statusError(resp, fmt.Sprintf("invalid Retry-After %q", v)))
			}
			o.Delay = max(d, time.Nanosecond) // 0 would mean the backoff step
		}
		return o
	case code == http.StatusRequestTimeout:
		return Failed(FailureHTTPStatus, statusError(resp, ""))
	case code >= 400 && code <= 499:
		return Outcome{Kind: OutcomeDrop}
	default:
		return Failed(FailureHTTPStatus, statusError(resp, ""))
	}
}

// statusError describes a response that failed: its status, a note, and
// an excerpt of its body.
func statusError(resp *http.Response, note string) error {
	var b strings.Builder
	b.WriteString("http: ")
	b.WriteString(resp.Status)
	if note != "" {
		b.WriteString(", ")
		b.WriteString(note)
	}
	if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		fmt.Fprintf(&b, ", redirect to %q (not followed)", loc)
	}
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, httpExcerptLimit+1))
	if len(excerpt) > 0 {
		cut := len(excerpt) > httpExcerptLimit
		if cut {
			excerpt = excerpt[:httpExcerptLimit]
		}
		fmt.Fprintf(&b, ": %q", strings.ToValidUTF8(string(excerpt), "\uFFFD"))
		if cut {
			b.WriteString("...")
		}
	}
	return errors.New(b.String())
}

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): a number of
// seconds, or an HTTP-date, which gives the time until then (0 if it has
// passed). A value that does not fit a time.Duration is invalid.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.Trim(v, " \t")
	if v != "" && strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(1<<63-1)/int64(time.Second) {
			return 0, false
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// transportFailure is the failure of a request that got no response: the
// handler's ctx ended (shutdown), the timeout passed, or the transport
// failed.
func (h *httpHandler) transportFailure(ctx context.Context, err error) Outcome {
	switch {
	case ctx.Err() != nil:
		return Failed(FailureCanceled, fmt.Errorf("http: cancelled: %w", context.Cause(ctx)))
	case isTimeout(err):
		return Failed(FailureTimeout, fmt.Errorf("http: timed out after %s", h.timeout))
	}
	return Failed(FailureUnreachable, fmt.Errorf("http: %w", err))
}

// isTimeout reports whether err is a deadline passing: the connection's, or
// the dialer's.
func isTimeout(err error) bool {
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// escapeHeaderName makes a record header name into the rest of an HTTP
// field name: a byte that is not a token character, and '%', becomes %XX.
func escapeHeaderName(name string) string {
	n := 0
	for i := 0; i < len(name); i++ {
		if !httpfield.TokenByte(name[i]) || name[i] == '%' {
			n++
		}
	}
	if n == 0 {
		return name
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(name)+2*n)
	for i := 0; i < len(name); i++ {
		if c := name[i]; httpfield.TokenByte(c) && c != '%' {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		}
	}
	return string(b)
}

// httpTextValue reports whether v is sent as is: empty, or printable ASCII
// that neither starts nor ends with a space.
func httpTextValue(v []byte) bool {
	if len(v) > 0 && (v[0] == ' ' || v[len(v)-1] == ' ') {
		return false
	}
	for _, c := range v {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
