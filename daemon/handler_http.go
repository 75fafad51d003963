package daemon

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The request headers of the http handler. Every request also carries the
// configured headers and, with bearer_token_file, Authorization: Bearer.
const (
	httpSubscriptionHeader = "Streamd-Subscription" // the subscription's name
	httpStreamKeyHeader    = "Streamd-Stream-Key"
	httpSeqHeader          = "Streamd-Seq"          // decimal
	httpShardHeader        = "Streamd-Shard"        // decimal shard id
	httpTimestampHeader    = "Streamd-Timestamp-Ms" // decimal ms since the epoch
	httpAttemptHeader      = "Streamd-Attempt"      // decimal, 1 for the first delivery

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
	// httpDrainLimit bounds how much of a response body is read so that
	// its connection can be reused; a longer body closes the connection.
	httpDrainLimit = 64 << 10
	// httpExcerptLimit bounds the body excerpt in a failure's error.
	httpExcerptLimit = 256
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
// Host. The Streamd- metadata headers are set after the configured ones
// and win over them.
//
// The outcome:
//
//	Streamd-Outcome response header     what it names (an invalid value: failed)
//	2xx                                 ack
//	429 or 503 with Retry-After         retry_after: delay-seconds, or until the HTTP-date (0 if past)
//	429 or 503 without it, or invalid   failed
//	other 4xx                           drop
//	1xx, 3xx, 5xx                       failed (redirects are not followed)
//	timeout, transport error            failed
//	ctx ended (shutdown)                failed
//
// Failed carries the status with an excerpt of the body, or the transport
// error; the settlement turns it into retry_after(the next backoff step).
//
// All deliveries share one client, whose transport is a copy of
// [http.DefaultTransport] (so $HTTPS_PROXY and $NO_PROXY apply, and HTTP/2
// is used when a TLS server offers it) keeping up to 128 idle connections,
// enough for a subscription's concurrency up to 128. Close closes them.
type httpHandler struct {
	url     *url.URL
	host    string      // a configured Host header, or ""
	headers http.Header // the configured headers and Authorization, canonical
	timeout time.Duration
	client  *http.Client
	tr      *http.Transport
}

func newHTTPHandler(cfg HandlerConfig) (*httpHandler, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %w", errors.Unwrap(err)) // without the URL, which may hold a secret
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("url: use an http:// or https:// URL with a host")
	}
	h := &httpHandler{
		url:     u,
		headers: make(http.Header, len(cfg.Headers)+1),
		timeout: time.Duration(cmp.Or(cfg.Timeout, defaultHTTPTimeout)),
	}
	for name, value := range cfg.Headers {
		if !validHeaderName(name) || !httpFieldValue(value) {
			return nil, fmt.Errorf("headers.%s: not a valid HTTP header", name)
		}
		if strings.EqualFold(name, "Host") {
			h.host = value
			continue
		}
		h.headers.Set(name, value)
	}
	if h.headers.Get("Content-Type") == "" {
		h.headers.Set("Content-Type", "application/octet-stream")
	}
	if cfg.BearerTokenFile != "" {
		token, err := readBearerToken(cfg.BearerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("bearer_token_file: %w", err)
		}
		h.headers.Set("Authorization", "Bearer "+token)
	}
	h.tr = http.DefaultTransport.(*http.Transport).Clone()
	h.tr.MaxIdleConns = httpMaxIdleConns
	h.tr.MaxIdleConnsPerHost = httpMaxIdleConns
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: %s holds no PEM certificate", cfg.CAFile)
		}
		h.tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	h.client = &http.Client{
		Transport: h.tr,
		// A POST that is redirected would become a GET without the
		// payload: report the 3xx instead.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
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
func (h *httpHandler) Close() error {
	h.tr.CloseIdleConnections()
	return nil
}

// Handle POSTs d and maps the response to an outcome.
func (h *httpHandler) Handle(ctx context.Context, d *Delivery) Outcome {
	rctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	var body *payloadSource
	if len(d.Payload) > httpCopyLimit {
		body = &payloadSource{p: d.Payload}
		defer body.detach()
	}
	resp, err := h.client.Do(h.request(rctx, d, body))
	if err != nil {
		return failedOutcome(h.transportError(ctx, rctx, err))
	}
	defer func() {
		io.CopyN(io.Discard, resp.Body, httpDrainLimit)
		resp.Body.Close()
	}()
	return h.outcome(resp)
}

// httpCopyLimit is the largest payload a request copies instead of reading
// it through a payloadSource.
const httpCopyLimit = 64 << 10

// request builds the POST for d. Its body is a copy of the payload when body
// is nil (payloads up to httpCopyLimit): the request owns the copy, and the
// transport, which knows the body is in memory, sends headers and body in
// one write. A larger payload is read through body.
func (h *httpHandler) request(ctx context.Context, d *Delivery, body *payloadSource) *http.Request {
	hdr := make(http.Header, len(h.headers)+len(d.Headers)+7)
	for name, values := range h.headers {
		hdr[name] = values // never appended to: each slice has len == cap
	}
	for _, e := range d.Headers {
		name := escapeHeaderName(e.Name)
		if httpTextValue(e.Value) {
			hdr.Set(httpRecordHeaderPrefix+name, string(e.Value))
			if e.Name == "content-type" && len(e.Value) > 0 {
				hdr.Set("Content-Type", string(e.Value))
			}
		} else {
			hdr.Set(httpBase64RecordHeaderPrefix+name, base64.StdEncoding.EncodeToString(e.Value))
		}
	}
	// The metadata: names canonical already, values in one allocation.
	meta := make([]string, 6)
	for i, v := range [...]struct {
		name, value string
	}{
		{httpSubscriptionHeader, d.Subscription},
		{httpStreamKeyHeader, d.Key},
		{httpSeqHeader, strconv.FormatUint(d.Seq, 10)},
		{httpShardHeader, strconv.FormatUint(d.Shard, 10)},
		{httpTimestampHeader, strconv.FormatUint(d.TimestampMs, 10)},
		{httpAttemptHeader, strconv.FormatUint(d.Attempt, 10)},
	} {
		meta[i] = v.value
		hdr[v.name] = meta[i : i+1 : i+1]
	}

	req := &http.Request{
		Method: http.MethodPost,
		URL:    h.url,
		Host:   h.host,
		Header: hdr,
	}
	switch {
	case len(d.Payload) == 0:
		req.Body = http.NoBody
		req.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	case body == nil:
		p := bytes.Clone(d.Payload)
		req.ContentLength = int64(len(p))
		req.Body = io.NopCloser(bytes.NewReader(p))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(p)), nil }
	default:
		req.ContentLength = int64(len(d.Payload))
		req.Body = &payloadReader{src: body}
		// GetBody lets the transport resend the request on another
		// connection when a kept-alive one was closed before it took it.
		req.GetBody = func() (io.ReadCloser, error) { return &payloadReader{src: body}, nil }
	}
	return req.WithContext(ctx)
}

// outcome maps a response to an outcome, as the httpHandler documentation
// tabulates.
func (h *httpHandler) outcome(resp *http.Response) Outcome {
	if v, ok := resp.Header[httpOutcomeHeader]; ok {
		o, err := parseOutcomeDirective(v[0])
		if err != nil {
			return failedOutcome(fmt.Errorf("http: %s response header: %w", httpOutcomeHeader, err))
		}
		return o
	}
	switch code := resp.StatusCode; {
	case code >= 200 && code <= 299:
		return Outcome{Kind: OutcomeAck}
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		v := resp.Header.Get("Retry-After")
		if v == "" {
			return failedOutcome(statusError(resp, "no Retry-After"))
		}
		d, ok := parseRetryAfter(v, time.Now())
		if !ok {
			return failedOutcome(statusError(resp, fmt.Sprintf("invalid Retry-After %q", v)))
		}
		return Outcome{Kind: OutcomeRetryAfter, Delay: d}
	case code >= 400 && code <= 499:
		return Outcome{Kind: OutcomeDrop}
	default:
		return failedOutcome(statusError(resp, ""))
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

// transportError describes a request that got no response: the handler's
// ctx ended (shutdown), the timeout passed, or the transport failed.
func (h *httpHandler) transportError(ctx, rctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("http: cancelled: %w", context.Cause(ctx))
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("http: timed out after %s", h.timeout)
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err // without the URL, which may hold a secret
	}
	return fmt.Errorf("http: %w", err)
}

// escapeHeaderName makes a record header name into the rest of an HTTP
// field name: a byte that is not a token character, and '%', becomes %XX.
func escapeHeaderName(name string) string {
	n := 0
	for i := 0; i < len(name); i++ {
		if !httpTokenByte(name[i]) || name[i] == '%' {
			n++
		}
	}
	if n == 0 {
		return name
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(name)+2*n)
	for i := 0; i < len(name); i++ {
		if c := name[i]; httpTokenByte(c) && c != '%' {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		}
	}
	return string(b)
}

// httpTokenByte reports whether c is an HTTP token character (RFC 9110
// §5.6.2).
func httpTokenByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
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

// httpFieldValue reports whether v is a valid HTTP field value: no control
// characters but tab.
func httpFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// errPayloadDetached is what a request body reads once Handle returned.
var errPayloadDetached = errors.New("the delivery's payload is no longer valid")

// payloadSource guards a delivery's payload, which is valid only until
// Handle returns, against the transport, which may still read a request
// body after Client.Do returned (when the server answered early).
type payloadSource struct {
	mu       sync.Mutex
	p        []byte
	detached bool
}

// detach ends every read of the payload.
func (s *payloadSource) detach() {
	s.mu.Lock()
	s.p, s.detached = nil, true
	s.mu.Unlock()
}

// payloadReader reads a payloadSource from the start.
type payloadReader struct {
	src *payloadSource
	off int
}

func (r *payloadReader) Read(b []byte) (int, error) {
	r.src.mu.Lock()
	defer r.src.mu.Unlock()
	if r.src.detached {
		return 0, errPayloadDetached
	}
	if r.off >= len(r.src.p) {
		return 0, io.EOF
	}
	n := copy(b, r.src.p[r.off:])
	r.off += n
	return n, nil
}

func (r *payloadReader) Close() error { return nil }
