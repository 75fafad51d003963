// Package h1 posts in-memory bodies to one origin over HTTP/1.1 on kept-alive
// connections, each exchange written and read by the calling goroutine.
//
// It is the http handler's transport. net/http's Transport hands every
// request to two goroutines of its connection, a writer and a reader, and
// back again; with many small requests on a local network those hand-offs
// and the per-request bookkeeping cost more CPU than the exchange. A Client
// writes the request with one system call (writev when the body is large),
// reads the response in the caller with net/http's own parser
// ([http.ReadResponse]), and keeps the connection for the next request.
//
// What it does not do, by design: HTTP/2, proxies other than http:// ones,
// request bodies that are not in memory, following redirects, and asking
// for compressed responses.
package h1

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Options configure a Client.
type Options struct {
	// URL is the http:// or https:// URL every request is posted to.
	URL *url.URL
	// TLS configures https connections; nil uses the system roots. The
	// client sets ServerName and a session cache (unless set) and offers
	// only http/1.1.
	TLS *tls.Config
	// Proxy is an http:// proxy that every request goes through, or nil.
	// Plain requests are sent to it in absolute form; https ones through a
	// CONNECT tunnel. Credentials in the proxy URL are sent as
	// Proxy-Authorization: Basic.
	Proxy *url.URL
	// MaxIdle is the most idle connections kept (default 128).
	MaxIdle int
	// IdleTimeout closes, instead of reusing, a connection idle for longer
	// (default 90s, as net/http's default transport).
	IdleTimeout time.Duration
}

// DrainLimit bounds how much of a response body Close reads so that its
// connection can be reused; a longer body closes the connection.
const DrainLimit = 64 << 10

// copyLimit is the largest body copied behind the request header for one
// write; a larger body is written from the caller's slice with writev.
const copyLimit = 4 << 10

// MaxHeaderBytes bounds the status line and header fields of a response
// (with the interim responses before it), so that a server that sends
// header fields without end cannot make the client hold them all.
const MaxHeaderBytes = 1 << 20

// errHeaderTooLarge is the error of a response whose header passes
// MaxHeaderBytes.
var errHeaderTooLarge = fmt.Errorf("response header larger than %d bytes", MaxHeaderBytes)

// Client posts requests to one URL. It is safe for concurrent use: each
// exchange has a connection to itself.
type Client struct {
	target      string // the request-target: origin form, or absolute form through a proxy
	host        string // the default Host field
	addr        string // host:port dialled: the origin's, or the proxy's
	tunnel      string // host:port of a CONNECT through the proxy (https), or ""
	proxyAuth   string // the Proxy-Authorization value, or ""
	tls         *tls.Config
	maxIdle     int
	idleTimeout time.Duration

	mu     sync.Mutex
	idle   []*conn // most recently used last
	closed bool
}

// New returns a Client for o.URL.
func New(o Options) (*Client, error) {
	u := o.URL
	if u == nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("h1: the URL must be http:// or https:// with a host")
	}
	c := &Client{
		target:      u.RequestURI(),
		host:        removeZone(u.Host),
		addr:        hostPort(u),
		maxIdle:     cmp.Or(o.MaxIdle, 128),
		idleTimeout: cmp.Or(o.IdleTimeout, 90*time.Second),
	}
	if u.Scheme == "https" {
		c.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		if o.TLS != nil {
			c.tls = o.TLS.Clone()
		}
		if c.tls.ServerName == "" {
			c.tls.ServerName = u.Hostname()
		}
		if c.tls.ClientSessionCache == nil {
			// A connection dialled again resumes the TLS session.
			c.tls.ClientSessionCache = tls.NewLRUClientSessionCache(0)
		}
		c.tls.NextProtos = []string{"http/1.1"}
	}
	if p := o.Proxy; p != nil {
		if p.Scheme != "http" || p.Host == "" {
			return nil, fmt.Errorf("h1: proxy %s: only http:// proxies are supported", p.Redacted())
		}
		if p.User != nil {
			pass, _ := p.User.Password()
			c.proxyAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(p.User.Username()+":"+pass))
		}
		if c.tls != nil {
			c.tunnel = c.addr
		} else {
			c.target = "http://" + u.Host + u.RequestURI() // without credentials or fragment
		}
		c.addr = hostPort(p)
	}
	return c, nil
}

// hostPort is u's host with its scheme's default port when it names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// removeZone removes the zone of an IPv6 literal host, which the Host field
// does not carry.
func removeZone(host string) string {
	if !strings.HasPrefix(host, "[") {
		return host
	}
	i, j := strings.LastIndexByte(host, '%'), strings.LastIndexByte(host, ']')
	if i < 0 || j < i {
		return host
	}
	return host[:i] + host[j:]
}

// Request is one POST.
type Request struct {
	// Host is the Host field; "" sends the URL's host.
	Host string
	// AppendHeader appends the request's header fields, each
	// "Name: value\r\n", to b and returns it; nil appends none. The client
	// writes them as they are: the caller makes sure that each name is a
	// token and each value a valid field value, and adds none of Host,
	// Content-Length, Transfer-Encoding, Connection and Proxy-Authorization,
	// which the client writes.
	AppendHeader func(b []byte) []byte
	// Body is sent with its Content-Length. The client reads it only
	// during Post.
	Body []byte
}

// Post sends r and reads the response's status line and header, all within
// timeout and until ctx ends. The caller must close the response's Body,
// which reads what is left of it (up to [DrainLimit]) and keeps the
// connection for the next request; the timeout and ctx bound reading the
// body too.
//
// A kept-alive connection on which the server spoke while it was idle (a
// close, a 408) is not used. One that it closed as the request went out,
// found when nothing or a 408 comes back, is replaced by another and the
// request sent again: the exchange is at least once, not at most once.
func (c *Client) Post(ctx context.Context, timeout time.Duration, r *Request) (*http.Response, error) {
	deadline := time.Now().Add(timeout)
	for {
		pc, err := c.conn(ctx, deadline)
		if err != nil {
			return nil, err
		}
		resp, err := c.exchange(ctx, pc, deadline, r)
		again := pc.reused && ctx.Err() == nil && time.Now().Before(deadline)
		switch {
		case err != nil:
			pc.Close()
			if !again || pc.nread != pc.nreadBefore {
				return nil, err
			}
			// A kept-alive connection the server had closed: nothing
			// came back.
		case resp.StatusCode == http.StatusRequestTimeout && again:
			// A 408 on a kept-alive connection: most likely the server's
			// word that it closed the connection while idle, sent just
			// before the request.
			b := resp.Body.(*body)
			b.keep = false
			b.Close()
		default:
			return resp, nil
		}
	}
}

// exchange writes r on pc and reads the response's header.
func (c *Client) exchange(ctx context.Context, pc *conn, deadline time.Time, r *Request) (*http.Response, error) {
	if err := pc.SetDeadline(deadline); err != nil {
		return nil, err
	}
	stop := func() bool { return true }
	if ctx.Done() != nil {
		// Ending ctx ends a blocked read or write at once. The deadline is
		// set first, so that it cannot undo this.
		stop = context.AfterFunc(ctx, func() { pc.SetDeadline(time.Unix(1, 0)) })
	}
	pc.nreadBefore = pc.nread
	werr := c.write(pc, r)
	if werr != nil {
		werr = fmt.Errorf("writing the request: %w", werr)
	}
	pc.readLimit = pc.nread + MaxHeaderBytes // the buffer is empty: put and dial leave it so
	resp, err := http.ReadResponse(pc.br, nil)
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode <= 199 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(pc.br, nil) // an interim response: the final one follows
	}
	pc.readLimit = math.MaxInt64
	if err != nil {
		stop()
		return nil, cmp.Or(werr, fmt.Errorf("reading the response: %w", err))
	}
	// A response despite a failed write is the server's answer before it
	// read the whole body (a 413, say), after which it closed.
	resp.Body = &body{ReadCloser: resp.Body, c: c, pc: pc, stop: stop,
		keep: werr == nil && !resp.Close && resp.StatusCode != http.StatusSwitchingProtocols}
	return resp, nil
}

// write sends r's request line, header and body.
func (c *Client) write(pc *conn, r *Request) error {
	b := append(pc.wbuf[:0], "POST "...)
	b = append(b, c.target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, cmp.Or(r.Host, c.host)...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(r.Body)), 10)
	b = append(b, "\r\n"...)
	if c.proxyAuth != "" && c.tunnel == "" {
		b = append(b, "Proxy-Authorization: "...)
		b = append(b, c.proxyAuth...)
		b = append(b, "\r\n"...)
	}
	if r.AppendHeader != nil {
		b = r.AppendHeader(b)
	}
	b = append(b, "\r\n"...)
	var err error
	if len(r.Body) <= copyLimit {
		b = append(b, r.Body...)
		_, err = pc.Conn.Write(b)
	} else {
		bufs := net.Buffers{b, r.Body}
		_, err = bufs.WriteTo(pc.Conn)
	}
	pc.wbuf = b[:0]
	if cap(pc.wbuf) > 4*copyLimit {
		pc.wbuf = nil // a rare large header: not kept
	}
	return err
}

// conn returns an idle connection, or a new one.
func (c *Client) conn(ctx context.Context, deadline time.Time) (*conn, error) {
	now := time.Now()
	c.mu.Lock()
	for len(c.idle) > 0 {
		pc := c.idle[len(c.idle)-1]
		c.idle = c.idle[:len(c.idle)-1]
		if now.Sub(pc.idleSince) <= c.idleTimeout {
			c.mu.Unlock()
			if spokeWhileIdle(pc.Conn) {
				pc.Close()
				c.mu.Lock()
				continue
			}
			pc.reused = true
			return pc, nil
		}
		pc.Close()
	}
	c.mu.Unlock()
	return c.dial(ctx, deadline)
}

// dial connects to the origin, or through the proxy, and shakes hands for
// https.
func (c *Client) dial(ctx context.Context, deadline time.Time) (*conn, error) {
	d := net.Dialer{Deadline: deadline}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	err = c.handshake(&nc)
	stop()
	if err != nil {
		nc.Close()
		return nil, err
	}
	pc := &conn{Conn: nc, readLimit: math.MaxInt64}
	pc.br = bufio.NewReaderSize(pc, 4<<10)
	return pc, nil
}

// handshake opens the CONNECT tunnel and the TLS session that *nc needs,
// replacing *nc by the TLS connection.
// Its deadline and ctx are those of the connection.
func (c *Client) handshake(nc *net.Conn) error {
	if c.tunnel != "" {
		if err := c.connect(*nc); err != nil {
			return err
		}
	}
	if c.tls == nil {
		return nil
	}
	tc := tls.Client(*nc, c.tls)
	if err := tc.Handshake(); err != nil {
		return err
	}
	*nc = tc
	return nil
}

// connect asks the proxy on nc for a tunnel to c.tunnel.
func (c *Client) connect(nc net.Conn) error {
	b := []byte("CONNECT " + c.tunnel + " HTTP/1.1\r\nHost: " + c.tunnel + "\r\n")
	if c.proxyAuth != "" {
		b = append(b, "Proxy-Authorization: "+c.proxyAuth+"\r\n"...)
	}
	b = append(b, "\r\n"...)
	if _, err := nc.Write(b); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	// The server speaks only once the TLS handshake starts, so nothing but
	// the proxy's response is read here.
	br := bufio.NewReaderSize(io.LimitReader(nc, MaxHeaderBytes), 1<<10)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return fmt.Errorf("proxy: CONNECT: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("proxy: CONNECT: %s", resp.Status)
	}
	return nil
}

// put keeps pc for the next request, or closes it when the client is
// closed or already keeps MaxIdle connections.
func (c *Client) put(pc *conn) {
	// Bytes after the response mean its framing is not to be trusted; the
	// exchange's deadline must not outlive it (it would fail the peek).
	if pc.br.Buffered() > 0 || tlsHolds(pc) || pc.SetDeadline(time.Time{}) != nil {
		pc.Close()
		return
	}
	now := time.Now()
	pc.idleSince = now
	c.mu.Lock()
	// The pool is used last in, first out: the connections at its bottom
	// are the ones that go stale.
	for len(c.idle) > 0 && now.Sub(c.idle[0].idleSince) > c.idleTimeout {
		c.idle[0].Close()
		c.idle = c.idle[1:]
	}
	if c.closed || len(c.idle) >= c.maxIdle {
		c.mu.Unlock()
		pc.Close()
		return
	}
	c.idle = append(c.idle, pc)
	c.mu.Unlock()
}

// tlsHolds reports whether a TLS connection holds bytes after the response
// in its own buffers, where neither the bufio buffer nor the peek at the
// socket sees them: a read that cannot wait (its deadline has passed, so it
// makes no system call) finds them.
func tlsHolds(pc *conn) bool {
	if _, ok := pc.Conn.(*tls.Conn); !ok {
		return false
	}
	pc.SetReadDeadline(time.Unix(1, 0))
	_, err := pc.br.Peek(1)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// Close closes the idle connections, and each connection in use once its
// response body is closed.
func (c *Client) Close() error {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.closed = nil, true
	c.mu.Unlock()
	for _, pc := range idle {
		pc.Close()
	}
	return nil
}

// spokeWhileIdle reports whether the server sent something or closed the
// connection while it was idle: a 408, stray bytes, or the end. It peeks at
// the socket without blocking; nothing should be there.
func spokeWhileIdle(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	spoke := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		spoke = n > 0 || err == nil || err != unix.EAGAIN
		return true
	})
	return spoke || err != nil
}

// conn is one connection with its buffers. Its Read counts the bytes read,
// so that a request that got nothing back is told apart.
type conn struct {
	net.Conn
	br          *bufio.Reader // reads through conn.Read
	wbuf        []byte
	nread       int64 // bytes read on the connection
	nreadBefore int64 // nread when the current request was written
	readLimit   int64 // nread at which reading fails: the end of MaxHeaderBytes while a header is read
	reused      bool  // it carried an earlier exchange
	idleSince   time.Time
}

func (pc *conn) Read(p []byte) (int, error) {
	left := pc.readLimit - pc.nread
	if left <= 0 {
		return 0, errHeaderTooLarge
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	n, err := pc.Conn.Read(p)
	pc.nread += int64(n)
	return n, err
}

// body is a response body that gives its connection back when closed.
type body struct {
	io.ReadCloser
	c    *Client
	pc   *conn
	stop func() bool // stops the ctx watch; false if it has fired
	keep bool        // the connection may carry another exchange
	done bool
}

// Close reads the rest of the body, up to DrainLimit, and keeps the
// connection if it got to the end in time; otherwise it closes it.
func (b *body) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	_, err := io.CopyN(io.Discard, b.ReadCloser, DrainLimit+1)
	ended := errors.Is(err, io.EOF)
	if !ended {
		b.pc.Close() // first: closing the body would read the rest of it
	}
	b.ReadCloser.Close()
	switch {
	case b.stop() && b.keep && ended:
		b.c.put(b.pc)
	case ended:
		b.pc.Close()
	}
	return nil
}
