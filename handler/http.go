package handler

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/streamd/streamd/conf"
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
	// httpDrainLimit bounds what is read of a response body after the
	// outcome so its connection can be kept; a longer body closes it.
	httpDrainLimit = 64 << 10
	// httpMaxHeaderBytes bounds a response's header (net/http's default
	// is 10 MiB).
	httpMaxHeaderBytes = 1 << 20
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
//	                                    when it has a valid one in the future, else for the next
//	                                    backoff step
//	401, 403, 404, 405, 407             failed, with what to check: the url or the credentials
//	                                    are wrong, not the record (see refusalHint)
//	408                                 failed
//	other 4xx                           drop (with the status as Err, which the daemon logs)
//	1xx, 3xx, 5xx                       failed (redirects are not followed)
//	timeout, transport error            failed
//	ctx ended (shutdown)                failed (cancelled)
//
// Failed carries the status with an excerpt of the body, or the transport
// error: the delivery failed, and the record is delivered again in place.
//
// All deliveries share one net/http client: HTTP/1.1 on kept-alive
// connections, up to 128 kept idle, redirects not followed, proxies from
// $HTTP_PROXY, $HTTPS_PROXY and $NO_PROXY. Close closes the idle
// connections.
type httpHandler struct {
	url         string
	host        string      // a configured Host header, or ""
	fixed       http.Header // the configured header fields, Authorization and User-Agent
	contentType string      // the Content-Type unless the record has one
	timeout     time.Duration
	transport   *http.Transport
	client      *http.Client
	// fresh sends a request again on a connection of its own (no
	// keep-alive), when its kept-alive one was closed before an answer.
	fresh *http.Client
}

func newHTTPHandler(cfg conf.Handler) (*httpHandler, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, optionErrorf("url", "%w", errors.Unwrap(err)) // without the URL, which may hold a secret
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, optionErrorf("url", "use an http:// or https:// URL with a host")
	}
	if !httpfield.ValidRequestTarget(u.RequestURI()) {
		return nil, optionErrorf("url", "the query holds a space, a control character or a byte beyond ASCII; percent-encode it")
	}
	h := &httpHandler{
		url:         u.String(),
		fixed:       make(http.Header),
		contentType: "application/octet-stream",
		timeout:     time.Duration(cmp.Or(cfg.Timeout, conf.DefaultHTTPTimeout)),
	}
	userAgent := httpUserAgent
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		value := strings.Trim(cfg.Headers[name], " \t")
		if !httpfield.ValidName(name) || !httpfield.ValidValue(value) {
			return nil, &OptionError{Option: "headers", Err: fmt.Errorf("headers.%s: not a valid HTTP header", name)}
		}
		if why := httpfield.Reserved(name); why != "" {
			return nil, &OptionError{Option: "headers", Err: fmt.Errorf("headers.%s: %s", name, why)}
		}
		switch http.CanonicalHeaderKey(name) {
		case "Host":
			if !httpfield.ValidHost(value) {
				return nil, &OptionError{Option: "headers", Err: fmt.Errorf("headers.%s: %q is not a host[:port]", name, value)}
			}
			h.host = value
		case "Content-Type":
			h.contentType = value
		case "User-Agent":
			userAgent = value
		default:
			h.fixed.Set(name, value)
		}
	}
	h.fixed.Set("User-Agent", userAgent)
	if cfg.BearerTokenFile != "" {
		token, err := readBearerToken(cfg.BearerTokenFile)
		if err != nil {
			return nil, optionErrorf("bearer_token_file", "%w", err)
		}
		h.fixed.Set("Authorization", "Bearer "+token)
	}
	h.transport = &http.Transport{
		Proxy:       http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{Timeout: h.timeout, KeepAlive: 30 * time.Second}).DialContext,
		// A dial outlives the request that gave up on it (it may serve
		// the next one): a silent TLS server must not hold it for ever.
		TLSHandshakeTimeout: h.timeout,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, ClientSessionCache: tls.NewLRUClientSessionCache(0)},
		MaxIdleConns:        httpMaxIdleConns,
		MaxIdleConnsPerHost: httpMaxIdleConns,
		IdleConnTimeout:     90 * time.Second,
		// A server that sends header fields without end is cut off.
		MaxResponseHeaderBytes: httpMaxHeaderBytes,
		DisableCompression:     true, // the excerpt of a failure's body is shown as sent
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, optionErrorf("ca_file", "%w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, optionErrorf("ca_file", "%s holds no PEM certificate", cfg.CAFile)
		}
		h.transport.TLSClientConfig.RootCAs = pool
	}
	if err := checkProxyEnv(u); err != nil {
		return nil, err
	}
	h.client = &http.Client{
		Transport: h.transport,
		Timeout:   h.timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect fails the delivery, see outcome
		},
	}
	fresh := h.transport.Clone()
	fresh.DisableKeepAlives = true
	h.fresh = &http.Client{Transport: fresh, CheckRedirect: h.client.CheckRedirect}
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
func (h *httpHandler) Close() error {
	h.transport.CloseIdleConnections()
	return nil
}

// Handle POSTs d and maps the response to an outcome.
func (h *httpHandler) Handle(ctx context.Context, d *Delivery) Outcome {
	resp, o := h.send(ctx, d.Payload, h.header(d))
	if resp == nil {
		return o
	}
	defer release(resp)
	return h.outcome(resp)
}

// send POSTs body with header and returns the response, to be released,
// or nil and the outcome of a request that got no response to read: a
// transport failure, or a 101, whose body is the connection itself, which
// no timeout bounds.
func (h *httpHandler) send(ctx context.Context, body []byte, header http.Header) (*http.Response, Outcome) {
	// Whether the request went on a kept-alive connection, and got a
	// byte of an answer: a failure on a reused connection without one may
	// be the server's closing it, not a server down.
	// (The transport's goroutines tell them.)
	var reused, answered atomic.Bool
	trace := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(info httptrace.GotConnInfo) { reused.Store(info.Reused) },
		GotFirstResponseByte: func() { answered.Store(true) },
	})
	post := func(c *http.Client) (*http.Response, error) {
		req, err := http.NewRequestWithContext(trace, http.MethodPost, h.url, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Host = h.host
		req.Header = header
		return c.Do(req)
	}
	start := time.Now()
	resp, err := post(h.client)
	if left := h.timeout - time.Since(start); err != nil && reused.Load() && !answered.Load() && ctx.Err() == nil && !isTimeout(err) && left > 0 {
		// The kept-alive connection was closed by the server before it
		// answered (its idle timeout crossed the request, or it closes
		// after each answer without saying so): sent again at once on
		// a connection of its own (another kept-alive one may be closed
		// too), within what is left of the timeout. The server may have
		// taken the request; so would a delivery held and sent again (at
		// least once).
		c := *h.fresh
		c.Timeout = left
		resp, err = post(&c)
	}
	if err != nil {
		return nil, h.transportFailure(ctx, err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body.Close()
		return nil, Failed(FailureHTTPStatus, errors.New("http: 101 Switching Protocols: the server switched to another protocol instead of answering"))
	}
	return resp, Outcome{}
}

// release drains what is left of resp's body, up to a bound, so that its
// connection is kept, and closes it.
func release(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, httpDrainLimit))
	resp.Body.Close()
}

// newHeader returns a request's header with the configured fields, and
// room for extra more.
func (h *httpHandler) newHeader(extra int) http.Header {
	header := make(http.Header, len(h.fixed)+extra)
	maps.Copy(header, h.fixed)
	return header
}

// header returns the header fields of d's request: the configured ones,
// the record's headers, Content-Type, and the metadata.
func (h *httpHandler) header(d *Delivery) http.Header {
	n := len(d.Headers) + len(deliveryMeta) + 1
	header := h.newHeader(n)
	vs := make(fieldValues, 0, n)
	putRecordFields(header, &vs, d)
	contentType := h.contentType
	for _, e := range d.Headers {
		if e.Name == "content-type" && len(e.Value) > 0 && httpTextValue(e.Value) {
			contentType = string(e.Value)
		}
	}
	vs.put(header, "Content-Type", contentType)
	return header
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
			// A Retry-After of 0 or a date gone by leaves the next backoff
			// step: asking again at once would storm a server that says
			// it is overloaded.
			o.Delay = max(d, 0)
		}
		return o
	case dropsByStatus(code):
		return Outcome{Kind: OutcomeDrop, Err: statusError(resp, "")}
	default:
		return Failed(FailureHTTPStatus, statusError(resp, refusalHint(code)))
	}
}

// dropsByStatus reports whether a status drops the record it answers: a
// 4xx that judges the record. 408 and 429 do not, nor a status that says
// the url or the credentials are wrong (see refusalHint): it would drop
// every record, so it fails the delivery instead, and holds the record.
func dropsByStatus(code int) bool {
	return code >= 400 && code <= 499 && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests &&
		refusalHint(code) == ""
}

// refusalHint says what to check for a 4xx status that a wrong url or
// credentials cause, not the record, "" for others.
func refusalHint(code int) string {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return "the server refuses the credentials: check bearer_token_file and the configured headers"
	case http.StatusProxyAuthRequired:
		return "the proxy refuses the credentials: check the user and password in $HTTP_PROXY or $HTTPS_PROXY"
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return "check the url: the server takes no POST there"
	}
	return ""
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
// passed). A number of seconds that does not fit a time.Duration gives the
// longest one, which max_retry_after cuts as any long delay.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.Trim(v, " \t")
	if v != "" && strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(math.MaxInt64)/int64(time.Second) {
			return math.MaxInt64, true // ErrRange: digits alone, too many of them
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// transportFailure is the failure of a request that got no whole
// response, none or not all of a batch's answer: the handler's ctx ended
// (shutdown), the timeout passed, or the transport failed.
func (h *httpHandler) transportFailure(ctx context.Context, err error) Outcome {
	switch {
	case ctx.Err() != nil:
		return Failed(FailureCanceled, fmt.Errorf("http: cancelled: %w", context.Cause(ctx)))
	case isTimeout(err):
		return Failed(FailureTimeout, fmt.Errorf("http: timed out after %s", h.timeout))
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err // without the URL, which may hold a secret
	}
	if isTLSFailure(err) {
		return Failed(FailureTLS, fmt.Errorf("http: %w", err))
	}
	if strings.HasPrefix(err.Error(), "http: ") { // net/http's own says it already
		return Failed(FailureUnreachable, err)
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

// checkProxyEnv checks the proxy the environment sets for requests to u
// ($HTTP_PROXY or $HTTPS_PROXY, in either case). net/http takes a value
// it cannot parse for no proxy at all, and a value with a scheme and a
// bad port for a host named after the scheme: a typo would send records
// past the proxy, or nowhere. A bad value is refused only when net/http
// would use a proxy for u (not for a loopback host, nor one $NO_PROXY
// exempts), where it is sure to misdirect records, and so is any proxy
// for an http URL in a CGI environment ($REQUEST_METHOD set), which
// net/http refuses.
func checkProxyEnv(u *url.URL) error {
	env := httpproxy.FromEnvironment()
	if _, err := env.ProxyFunc()(u); err != nil {
		return fmt.Errorf("the proxy of $HTTP_PROXY: %w", err)
	}
	// Whether u goes through a proxy, whatever the variables' values.
	env.HTTPProxy, env.HTTPSProxy, env.CGI = "http://proxy.invalid", "http://proxy.invalid", false
	if p, _ := env.ProxyFunc()(u); p == nil {
		return nil
	}
	for _, name := range []string{strings.ToUpper(u.Scheme) + "_PROXY", u.Scheme + "_proxy"} {
		if v := os.Getenv(name); v != "" {
			if err := checkProxyURL(v); err != nil {
				return fmt.Errorf("$%s=%s: %w: set it to http://HOST:PORT (https:// or socks5:// for such a proxy, USER:PASSWORD@ before HOST for its credentials), or unset it",
					name, redactProxy(v), err)
			}
		}
	}
	return nil
}

// checkProxyURL checks a proxy URL as net/http uses it: HOST:PORT alone
// is an http proxy.
func checkProxyURL(v string) error {
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	p, err := url.Parse(v)
	switch {
	case err != nil && strings.Contains(v, "@"):
		// The parser's error may quote a piece of the password.
		return errors.New("it is not a URL; percent-encode any of / ? # % @ and spaces in USER:PASSWORD")
	case err != nil:
		return errors.Unwrap(err) // without the URL
	}
	switch p.Scheme {
	case "http", "https", "socks5", "socks5h":
	default:
		return fmt.Errorf("a proxy scheme is http, https, socks5 or socks5h, not %q", p.Scheme)
	}
	if p.Hostname() == "" {
		return errors.New("the proxy URL has no host")
	}
	if port := p.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("the proxy port %s is not 1 to 65535", port)
		}
	}
	return nil
}

// redactProxy returns the proxy URL v with the credentials before its
// host, if any, replaced by xxxxx.
func redactProxy(v string) string {
	at := strings.LastIndex(v, "@")
	if at < 0 {
		return v
	}
	start := 0
	if i := strings.Index(v, "://"); i >= 0 && i < at {
		start = i + len("://")
	}
	return v[:start] + "xxxxx" + v[at:]
}
