package handler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/streamd/streamd/conf"
	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/internal/wakeup"
)

// natsMsgIDHeader is the header JetStream reads to drop a message it has
// already stored within the stream's duplicate window.
const natsMsgIDHeader = jetstream.MsgIDHeader

// natsMaxPending is the client library's bound on the asynchronous
// publishes of one handler waiting for their acknowledgement, past which
// it would stall them: none, since the daemon bounds them itself (a
// subscription's concurrency, times its batch_max_records with batches;
// each subscription builds its own handler).
const natsMaxPending = math.MaxInt

// natsHandler publishes each record into a NATS JetStream stream and waits
// for the stream's acknowledgement.
//
// The subject is the configured one, in which Load replaced {key} by the
// subscription's stream key. The message body is the payload; its headers
// are the record's headers, under the names and encoding the http handler uses
// (Streamd-Header-<name>, or Streamd-Base64-Header-<name> for a value that
// is not plain text), the delivery's metadata (Streamd-Subscription,
// Streamd-Stream-Key, Streamd-Seq, Streamd-Shard, Streamd-Timestamp-Ms,
// Streamd-Attempt), and Nats-Msg-Id (natsMsgID: the subscription and the
// record's identity in its file), which lets JetStream
// drop a record the subscription publishes again after a crash. A delivery
// without a file (a pipe stage's) is published without Nats-Msg-Id: at
// least once.
//
// The outcome:
//
//	PubAck                                     ack
//	PubAck with duplicate                      ack, marked Duplicate
//	larger than the server's max_payload       drop, logged
//	  or the stream's max_msg_size
//	no responders (no stream captures the      failed (held in place)
//	  subject), timeout, disconnected,
//	  another refusal (the stream's limits)
//	ctx ended (shutdown)                       failed (cancelled)
//
// One connection serves every delivery; with a subscription's concurrency
// above 1, that many publishes wait for their acknowledgement at once, and
// with batches (HandleBatch) that many batches, each published whole
// before its acknowledgements are awaited.
// The connection reconnects without end while the daemon runs, through
// outages and refused credentials alike; a publish while it is
// disconnected fails at once. When the client closes it for good (an
// error it does not recover from, such as an -ERR it does not know), the
// handler connects anew. A handler built while no server answers
// starts so, waiting like one that lost its servers (its deliveries fail
// and are held), and looks for the stream that captures its subject once
// it connects. Close drains nothing: it closes the connection, and ends
// a try to connect under way at once (natsDialer).
type natsHandler struct {
	conn    atomic.Pointer[natsConn] // the connection in use
	url     string
	opts    []nats.Option // how it connects, and connects anew, but its dialer (connect)
	subject string
	timeout time.Duration
	logger  *slog.Logger
	late    sync.WaitGroup // the stream check of a connection made after the start, and connecting anew
	// ctx is the handler's lifetime: Close cancels it, and so does the
	// build's context while New runs. Its end closes the connections
	// being made or in use.
	ctx     context.Context
	cancel  context.CancelFunc
	batches sync.Pool     // of *natsBatch, for HandleBatch
	nkey    nkeys.KeyPair // the seed of nkey_file, read at the build; nil without
	errLog  ratelog.Line  // the server's errors, at most one line per ratelog.Every
	dialLog ratelog.Line  // the failed tries to (re)connect, likewise
	// dialErr is why the last try to (re)connect failed, nil once one
	// succeeded: the client's LastError says so only after a while.
	dialErr atomic.Pointer[error]

	mu      sync.Mutex
	back    wakeup.Signal // woken at each (re)connection, under mu
	closing bool          // Close was called, under mu
	// When the client last closed a connection for good, and how long
	// connecting anew waited then (anewWait); under mu.
	anewAt   time.Time
	anewLast time.Duration
}

// natsAnewMaxWait is the longest wait before a connection closed for good
// is made anew (or the handler's timeout, if longer); a connection made
// anew that lasted longer than it is made anew at once again.
const natsAnewMaxWait = time.Minute

// natsConn is a connection of a natsHandler and the JetStream context
// that publishes on it.
type natsConn struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// newNATSConn returns the JetStream context of publishes on nc: timed out
// after timeout, and without the client's bound on those in flight.
func newNATSConn(nc *nats.Conn, timeout time.Duration) (*natsConn, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(timeout), jetstream.WithPublishAsyncMaxPending(natsMaxPending))
	if err != nil {
		return nil, err
	}
	return &natsConn{nc: nc, js: js}, nil
}

// newNATSHandler connects to cfg's servers and checks that a JetStream
// stream captures the subject. With mustReach (check-config), servers
// that do not answer, or no such stream, are an error; otherwise the
// handler starts without them (its deliveries fail and are held), connects
// when a server answers, and logs a stream missing at ERROR. ctx's end
// (the daemon told to stop) ends the build at once, with an error.
func newNATSHandler(ctx context.Context, cfg conf.Handler, logger *slog.Logger, mustReach bool) (*natsHandler, error) {
	if strings.Contains(cfg.Subject, "{key}") {
		return nil, fmt.Errorf("subject %q: replace {key} by the subscription's stream key, as loading a configuration file does", cfg.Subject)
	}
	h := &natsHandler{
		url:     cfg.URL,
		subject: cfg.Subject,
		timeout: time.Duration(cmp.Or(cfg.Timeout, conf.DefaultNATSTimeout)),
		logger:  logger,
	}
	opts := []nats.Option{
		nats.Name("streamd"),
		nats.Timeout(h.timeout),
		// A write to a server that stopped reading fails after the
		// handler's timeout (and the connection reconnects) rather than
		// the default minute, so that a delivery ends in time.
		nats.FlusherTimeout(h.timeout),
		nats.ReconnectOnFlusherError(),
		nats.MaxReconnects(-1),
		// Credentials refused twice in a row (a rotation under way) do not
		// end the connection for good, as by default: it keeps trying.
		nats.IgnoreAuthErrorAbort(),
		// A publish while disconnected fails at once (a failed delivery,
		// held) rather than waiting in a buffer for the timeout.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && h.ctx.Err() == nil { // not the end of the handler closing the connection
				logger.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			h.dialErr.Store(nil)
			logger.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
			h.wakeHeld()
		}),
		// Why the servers do not answer (refused, timed out, credentials
		// refused), from the first try of a handler that starts without
		// them on.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if h.ctx.Err() != nil { // the handler's end, not the servers
				return
			}
			h.dialErr.Store(&err)
			h.dialLog.Warn(logger, "connecting to NATS failed; trying again", "url", cfg.URL, "err", err)
		}),
		// What the server says outside a publish's answer, such as a
		// permission it refuses.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			h.errLog.Warn(logger, "NATS error", "err", err)
		}),
	}

	// The client reads these files at each connection (they may be
	// rotated); a start checks it can, naming the keys.
	var tlsOpts []nats.Option
	if cfg.CAFile != "" {
		tlsOpts = append(tlsOpts, namedOption("ca_file", "ca_file", nats.RootCAs(cfg.CAFile)))
	}
	if cfg.CertFile != "" {
		tlsOpts = append(tlsOpts, namedOption("cert_file", "cert_file and key_file", nats.ClientCert(cfg.CertFile, cfg.KeyFile)))
	}
	for _, o := range tlsOpts {
		if err := o(&nats.Options{}); err != nil {
			return nil, err
		}
	}
	opts = append(opts, tlsOpts...)
	// Last of the files read: the nkey seed, which the handler then holds
	// (wiped by Close).
	switch {
	case cfg.CredsFile != "":
		// The client reads the file at each connection (it may be
		// rotated); a start checks it can.
		if err := checkCreds(cfg.CredsFile); err != nil {
			return nil, optionErrorf("creds_file", "%w", err)
		}
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.NkeyFile != "":
		// Read once, unlike the client's own option, which reads the
		// file again at each connection: a rotated file would then fail
		// them until a reload built the handler again, as it does.
		kp, pub, err := readNkey(cfg.NkeyFile)
		if err != nil {
			return nil, optionErrorf("nkey_file", "%w", err)
		}
		h.nkey = kp
		opts = append(opts, nats.Nkey(pub, kp.Sign))
	case cfg.User != "":
		password, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return nil, optionErrorf("password_file", "%w", err)
		}
		opts = append(opts, nats.UserInfo(cfg.User, strings.TrimRight(string(password), "\r\n")))
	}
	if !mustReach {
		// With no server answering, Connect returns a connection that
		// keeps trying, after one try of each server.
		opts = append(opts, nats.RetryOnFailedConnect(true), nats.ConnectHandler(h.connected), nats.ClosedHandler(h.closedForGood))
	}
	h.opts = opts
	h.ctx, h.cancel = context.WithCancel(context.Background())
	stopBuild := context.AfterFunc(ctx, h.cancel)
	nc, err := h.connect()
	if err != nil {
		stopBuild()
		h.cancel()
		h.wipe()
		if key := credentialKey(cfg); key != "" && errors.Is(err, nats.ErrAuthorization) {
			return nil, &OptionError{Option: key, Err: fmt.Errorf("connecting to %s: %w: the server refuses the credentials of %s", cfg.URL, err, key)}
		}
		return nil, &OptionError{Option: "url", Err: fmt.Errorf("connecting to %s: %w", cfg.URL, err)}
	}
	connected := h.Reconnected() // taken before IsConnected: a connection made after it closes it
	c, err := newNATSConn(nc, h.timeout)
	if err == nil {
		// Unless a connection made anew replaced nc already: closed for
		// good before the build stored it (closedForGood).
		h.conn.CompareAndSwap(nil, c)
		// Closed for good already, before it was in use: an error when
		// the server must be reached now; otherwise closedForGood
		// connects anew, as for a connection closed later.
		if mustReach && nc.IsClosed() {
			err = &OptionError{Option: "url", Err: fmt.Errorf("connecting to %s: %w", cfg.URL, cmp.Or(nc.LastError(), nats.ErrConnectionClosed))}
		}
	}
	stopped := func() error {
		return &OptionError{Option: "url", Err: fmt.Errorf("connecting to %s: given up, told to stop: %w", cfg.URL, context.Cause(ctx))}
	}
	switch {
	case err != nil:
	case h.ctx.Err() != nil:
		err = stopped()
	case nc.IsConnected() && mustReach:
		err = h.checkStream(nc)
	case nc.IsConnected():
		// A stream missing holds this subscription's deliveries, as a
		// server missing does, not the daemon's start.
		if err := h.checkStream(nc); err != nil {
			logger.Error("connected to NATS, but deliveries fail and are held until this is mended", "err", err)
		}
	default:
		// Start as a handler that lost its servers does, and look for the
		// stream once connected.
		logger.Warn("not connected to NATS yet: deliveries fail and are held until it is", "url", cfg.URL)
		h.late.Go(func() { h.checkWhenConnected(connected) })
	}
	if !stopBuild() && err == nil { // told to stop meanwhile: the handler's tries ended
		err = stopped()
	}
	if err != nil {
		h.conn.CompareAndSwap(nil, &natsConn{nc: nc}) // for Close
		h.Close()
		return nil, err
	}
	return h, nil
}

// credentialKey returns the configuration key of cfg's credentials, ""
// without any.
func credentialKey(cfg conf.Handler) string {
	switch {
	case cfg.CredsFile != "":
		return "creds_file"
	case cfg.NkeyFile != "":
		return "nkey_file"
	case cfg.User != "":
		return "password_file"
	}
	return ""
}

// connect makes a connection to the servers with h's options and a
// dialer of its own (natsDialer), which h's end interrupts.
func (h *natsHandler) connect() (*nats.Conn, error) {
	return nats.Connect(h.url, append(slices.Clip(h.opts), nats.SetCustomDialer(&natsDialer{ctx: h.ctx, timeout: h.timeout}))...)
}

// natsDialer dials the servers of one client connection, each try
// bounded by timeout, and closes each connection it made once ctx ends.
// The client's handshake (waiting for the server's INFO, under the
// connection's lock, which its Close takes) is bounded only by the
// timeout for each server: a server that accepts and never answers would
// hold a stop that long. It closes, at each dial, the connection it made
// before, which the client is done with then but leaves open when its
// handshake failed while reconnecting: nothing accumulates over
// reconnections.
type natsDialer struct {
	ctx     context.Context
	timeout time.Duration
	mu      sync.Mutex
	last    net.Conn // the connection made before; nil once closed
}

// Dial implements [nats.CustomDialer].
func (d *natsDialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last != nil {
		d.last.Close()
		d.last = nil
	}
	c, err := (&net.Dialer{Timeout: d.timeout}).DialContext(d.ctx, network, address)
	if err != nil {
		return nil, err
	}
	d.last = &ctxConn{Conn: c, stop: context.AfterFunc(d.ctx, func() { c.Close() })}
	return d.last, nil
}

// ctxConn is a connection that the end of a context closes (stop undoes
// that).
type ctxConn struct {
	net.Conn
	stop func() bool
}

// Close closes the connection and forgets the context.
func (c *ctxConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

// readNkey reads the user nkey seed in the file at path, and returns it
// and its public key.
func readNkey(path string) (nkeys.KeyPair, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	defer clear(b) // the seed is a secret
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, "", fmt.Errorf("%s holds no nkey seed: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		kp.Wipe()
		return nil, "", fmt.Errorf("%s holds no user nkey seed (its public key starts with U); make one with nsc or nk -gen user", path)
	}
	return kp, pub, nil
}

// wipe forgets the nkey seed the handler holds, if any.
func (h *natsHandler) wipe() {
	if h.nkey != nil {
		h.nkey.Wipe()
	}
}

// namedOption makes the error of o, an option that reads files, an
// [OptionError] of option that names the configuration keys of the files.
func namedOption(option, keys string, o nats.Option) nats.Option {
	return func(opts *nats.Options) error {
		if err := o(opts); err != nil {
			return &OptionError{Option: option, Err: fmt.Errorf("%s: %w", keys, err)}
		}
		return nil
	}
}

// checkCreds checks that the credentials file at path can be read and
// holds a user JWT and the seed of that user, as the client reads them to
// connect.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer clear(b) // the seed is a secret
	// A file without the decorations is taken whole as the JWT.
	token, err := nkeys.ParseDecoratedJWT(b)
	var claims *jwt.UserClaims
	if err == nil {
		claims, err = jwt.DecodeUserClaims(token)
	}
	if err != nil {
		return fmt.Errorf("%s holds no user JWT: %w", path, err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("%s holds no user seed: %w", path, err)
	}
	defer kp.Wipe()
	if pub, err := kp.PublicKey(); err != nil || pub != claims.Subject {
		return fmt.Errorf("%s: its seed is not that of the user of its JWT (%s)", path, claims.Subject)
	}
	return nil
}

// connected wakes the deliveries held while no server answered, at the
// first connection of nc, when nc is the connection in use: a connection
// made anew wakes them once it is.
func (h *natsHandler) connected(nc *nats.Conn) {
	if c := h.conn.Load(); c != nil && c.nc == nc {
		h.wakeHeld()
	}
}

// closedForGood connects anew when the client closed nc without Close:
// for good, after an error it does not recover from. Deliveries fail
// meanwhile, as while disconnected, and go again once the new connection
// is in use.
func (h *natsHandler) closedForGood(nc *nats.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return
	}
	wait := h.anewWait(time.Now())
	h.logger.Error("the NATS client closed its connection for good; connecting anew", "err", nc.LastError(), "in", wait)
	h.late.Go(func() { h.connectAnew(nc, wait) })
}

// anewWait returns how long to wait, from now, before connecting anew in
// place of a connection closed for good, under mu: at once the first
// time, but a server that closes each connection for good soon after it
// is made (an error right after the handshake) is connected to again
// after a wait that doubles from the timeout up to natsAnewMaxWait, not in
// a loop.
func (h *natsHandler) anewWait(now time.Time) time.Duration {
	longest := max(natsAnewMaxWait, h.timeout)
	wait := time.Duration(0)
	if !h.anewAt.IsZero() && now.Sub(h.anewAt) < h.anewLast+longest {
		wait = min(max(2*h.anewLast, h.timeout), longest)
	}
	h.anewAt, h.anewLast = now, wait
	return wait
}

// connectAnew makes a connection in place of old, which the client closed
// for good, after wait, then trying again every timeout until it can (an
// option that reads a file, such as ca_file, fails while the file cannot
// be read) or Close.
func (h *natsHandler) connectAnew(old *nats.Conn, wait time.Duration) {
	var failed ratelog.Line
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = h.timeout
		nc, err := h.connect()
		var c *natsConn
		if err == nil {
			c, err = newNATSConn(nc, h.timeout)
		}
		if err == nil {
			h.mu.Lock()
			defer h.mu.Unlock()
			// Not after Close, nor in place of a connection already made
			// anew, nor a connection itself closed for good already. A
			// build that has not stored old yet (nil) finds this one in
			// its place.
			if cur := h.conn.Load(); h.closing || cur != nil && cur.nc != old || nc.IsClosed() {
				nc.Close()
				return
			}
			h.conn.Store(c)
			if !nc.IsConnected() {
				// No server answered yet: the client keeps trying, and
				// its first connection wakes the deliveries (connected).
				h.logger.Warn("connecting to NATS anew: no server answers yet; deliveries fail and are held until one does", "url", h.url)
				return
			}
			h.logger.Info("connected to NATS anew", "url", h.url)
			h.back.Wake()
			return
		}
		failed.Warn(h.logger, "connecting to NATS anew failed; deliveries fail and are held until it succeeds; trying again", "err", err)
	}
}

// checkWhenConnected checks the stream (checkStream) once connected is
// closed, at the first connection of a handler that started without its
// servers, and logs what it finds missing; it returns at Close.
func (h *natsHandler) checkWhenConnected(connected <-chan struct{}) {
	select {
	case <-connected:
	case <-h.ctx.Done():
		return
	}
	nc := h.conn.Load().nc
	if err := h.checkStream(nc); err != nil && !nc.IsClosed() { // not closed by Close meanwhile
		h.logger.Error("connected to NATS, but deliveries fail and are held until this is mended", "err", err)
	}
}

// checkStream checks on nc that a JetStream stream captures the subject,
// and logs which.
func (h *natsHandler) checkStream(nc *nats.Conn) error {
	subject := h.subject
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
	defer cancel()
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return &OptionError{Option: "subject", Err: fmt.Errorf("subject %q: no JetStream stream captures it; create one whose subjects match it (nats stream add NAME --subjects %q --storage file --dupe-window 5m --defaults), or change subject", subject, subject)}
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return &OptionError{Option: "url", Err: fmt.Errorf("%s: JetStream is not enabled on the server, or for the account of the user (nothing answers its API): enable it (jetstream {} in the server's configuration, or nats-server --jetstream)", nc.ConnectedUrlRedacted())}
	case err != nil:
		return &OptionError{Option: "subject", Err: fmt.Errorf("subject %q: looking up the JetStream stream that captures it: %w", subject, err)}
	}
	h.logger.Info("forwarding into JetStream", "subject", subject, "stream", name, "server", nc.ConnectedUrlRedacted())
	return nil
}

// Reconnected returns a channel closed at the next (re)connection to a
// server ([Reconnecting]).
func (h *natsHandler) Reconnected() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.back.C()
}

// wakeHeld wakes the deliveries held while the connection was lost.
func (h *natsHandler) wakeHeld() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.back.Wake()
}

// Close closes the connection, and ends at once a try to connect under
// way (to a server that accepts and never answers, the client would wait
// for its timeout). A second call does nothing.
func (h *natsHandler) Close() error {
	h.mu.Lock()
	again := h.closing
	h.closing = true
	h.mu.Unlock()
	if again {
		return nil
	}
	h.cancel() // first: the client's Close waits for a handshake under way
	h.conn.Load().nc.Close()
	h.late.Wait()
	h.wipe() // no connection signs any more
	return nil
}

// Handle publishes d and waits for JetStream's acknowledgement: a batch
// of one (HandleBatch). It publishes asynchronously, as JetStream's own
// benchmark publisher does: the acknowledgements of the deliveries in
// flight (the subscription's concurrency) come back on one reply
// subscription, timed out by the client after the handler's timeout.
func (h *natsHandler) Handle(ctx context.Context, d *Delivery) Outcome {
	var out [1]Outcome
	h.HandleBatch(ctx, []Delivery{*d}, out[:])
	return out[0]
}

// HandleBatch publishes every record of ds, then waits for their
// acknowledgements, as nats bench's asynchronous publisher does with its
// batches: one goroutine keeps len(ds) publishes in flight. Each record
// gets its own outcome, as from Handle: those that failed are held and
// published again together.
func (h *natsHandler) HandleBatch(ctx context.Context, ds []Delivery, outs []Outcome) {
	b, _ := h.batches.Get().(*natsBatch)
	if b == nil {
		b = new(natsBatch)
	}
	b.start(len(ds))
	for i := range ds {
		err := ctx.Err() // once ctx ends, the rest is not published
		if err == nil {
			b.futures[i], err = h.conn.Load().js.PublishMsgAsync(b.message(i, h.subject, &ds[i]))
		}
		if err != nil {
			outs[i] = h.failure(ctx, &ds[i], &b.msgs[i], err)
		}
	}
	acked := true
	for i, f := range b.futures {
		if f != nil {
			var ok bool
			outs[i], ok = h.wait(ctx, &ds[i], &b.msgs[i], f)
			acked = acked && ok
		}
	}
	if acked { // the client is done with every message of b
		b.reset(len(ds))
		h.batches.Put(b)
	}
}

// natsBatch is the messages HandleBatch publishes, kept for the next batch
// once JetStream acknowledged each of them (the client is done with them
// then): their header maps take the next records' fields, so that a
// message costs no more than the values of its fields.
type natsBatch struct {
	msgs    []nats.Msg
	futures []jetstream.PubAckFuture
	values  fieldValues // of every message's fields
}

// start readies b for a batch of n records.
func (b *natsBatch) start(n int) {
	if n > len(b.msgs) {
		b.msgs = append(b.msgs, make([]nats.Msg, n-len(b.msgs))...)
	}
	b.futures = append(b.futures[:0], make([]jetstream.PubAckFuture, n)...)
}

// message returns the i-th message of b, made of d, to publish on subject.
func (b *natsBatch) message(i int, subject string, d *Delivery) *nats.Msg {
	m := &b.msgs[i]
	if m.Header == nil {
		m.Header = make(nats.Header, len(d.Headers)+len(deliveryMeta)+1) // +1: Nats-Msg-Id
	}
	m.Subject, m.Data = subject, d.Payload
	putRecordFields(m.Header, &b.values, d)
	if d.File != "" {
		b.values.put(m.Header, natsMsgIDHeader, natsMsgID(d))
	}
	return m
}

// reset empties the first n messages of b, and what they held, for the
// next batch: b keeps no record alive.
func (b *natsBatch) reset(n int) {
	for i := range b.msgs[:n] {
		clear(b.msgs[i].Header)
		b.msgs[i].Data = nil
	}
	clear(b.futures)
	clear(b.values)
	b.values = b.values[:0]
}

// wait waits for the acknowledgement of f, the publish of d's message m,
// and returns its outcome, and whether JetStream acknowledged it. Only
// then is the client done with m: it may still read it after an error (a
// retry of its own that a reconnection failed), and after ctx ended.
func (h *natsHandler) wait(ctx context.Context, d *Delivery, m *nats.Msg, f jetstream.PubAckFuture) (Outcome, bool) {
	var err error
	select {
	case ack := <-f.Ok():
		return Outcome{Kind: OutcomeAck, Duplicate: ack.Duplicate}, true
	case err = <-f.Err():
	case <-ctx.Done():
		select { // an acknowledgement at the same moment wins: the record is stored
		case ack := <-f.Ok():
			return Outcome{Kind: OutcomeAck, Duplicate: ack.Duplicate}, true
		default:
			err = ctx.Err()
		}
	}
	return h.failure(ctx, d, m, err), false
}

// failure maps the error of the publish of d's message m to an outcome.
func (h *natsHandler) failure(ctx context.Context, d *Delivery, m *nats.Msg, err error) Outcome {
	apiErr, isAPI := errors.AsType[*jetstream.APIError](err)
	nc := h.conn.Load().nc
	switch {
	case ctx.Err() != nil:
		return Failed(FailureCanceled, fmt.Errorf("nats: cancelled: %w", context.Cause(ctx)))
	case errors.Is(err, nats.ErrMaxPayload) || isAPI && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		// The limits count the message's headers too, not only the payload.
		size := m.Size()
		h.logger.Error("dropping a record too large for NATS (its payload and headers): raise the server's max_payload or the stream's max_msg_size to forward such records",
			"subject", h.subject, "seq", d.Seq, "bytes", size, "payload_bytes", len(d.Payload), "err", err)
		return Outcome{Kind: OutcomeDrop}
	case (errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout)) && errors.Is(nc.LastError(), nats.ErrPermissionViolation):
		// The server drops a message the user may not publish (or whose
		// acknowledgement it may not receive) and says so only to the
		// connection, as its last error.
		return Failed(FailureOther, fmt.Errorf("nats: no acknowledgement from JetStream within %s, after the server said %w: "+
			"grant the user publish permission on %q and subscribe permission on its reply subjects (_INBOX.>)", h.timeout, nc.LastError(), h.subject))
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, nats.ErrTimeout):
		return Failed(FailureTimeout, fmt.Errorf("nats: no acknowledgement from JetStream within %s", h.timeout))
	case isAPI:
		return Failed(FailureOther, fmt.Errorf("JetStream refused the message: %w", err))
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		return Failed(FailureUnreachable, fmt.Errorf("nats: no JetStream stream answered on subject %q: none captures it any more, or its server is unavailable", h.subject))
	case !nc.IsConnected():
		// What the client says then (a full outbound buffer, headers not
		// supported) names a consequence, not the cause: the last error
		// of the connection may (a server that refuses the credentials or
		// the TLS handshake, which the client retries without a word).
		last := nc.LastError()
		if p := h.dialErr.Load(); p != nil {
			last = *p // the latest: the client's may be from before the connection was lost
		}
		if last != nil {
			reason := FailureUnreachable
			if isTLSFailure(last) {
				reason = FailureTLS
			}
			return Failed(reason, fmt.Errorf("nats: not connected to any NATS server; reconnecting (last error: %w)", last))
		}
		return Failed(FailureUnreachable, errors.New("nats: not connected to any NATS server; reconnecting"))
	case strings.HasPrefix(err.Error(), "nats: "):
		return Failed(FailureUnreachable, err)
	}
	return Failed(FailureUnreachable, fmt.Errorf("nats: %w", err))
}

// natsMsgID is the Nats-Msg-Id of a subscription's record: the
// subscription, then the record's identity (appendRecordID). Two
// subscriptions forwarding one record into one stream (under two subjects)
// publish two messages, where the record's identity alone would make
// JetStream drop the second as a duplicate.
func natsMsgID(d *Delivery) string {
	var buf [96]byte
	b := append(buf[:0], d.Subscription...)
	b = append(b, ':')
	return string(d.appendRecordID(b))
}
