package natsconn

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/retrywait"
)

// How a component connects. The first connection is made within ConnectTimeout, attempt after attempt
// while the server is unreachable (refused, DNS failure, timeout); a server that answers but refuses the
// credentials, and a TLS handshake that fails, are not retried: they do not fix themselves, so Connect
// returns at once with the cause. Once connected, the client reconnects forever: a component outlives
// broker restarts. A server that later refuses the credentials twice in a row closes the connection for
// good (nats.go's rule); that and every other connection event is logged with its cause, and OnClosed
// lets a command stop instead of running on a dead connection. A subject the server refuses the user
// (its permissions) is logged as an error naming the subject: the refused request itself only times out.

// DefaultConnectTimeout bounds the wait for the first connection when ConnConfig.ConnectTimeout is 0.
const DefaultConnectTimeout = 30 * time.Second

// attemptTimeout bounds one connection attempt (dial, TLS handshake, CONNECT/PONG).
const attemptTimeout = 5 * time.Second

// Why a connection could not be made, for errors.Is on what Connect returns (a *ConnectError).
var (
	// ErrAuth: the server refused the credentials (authorization violation; expired or revoked
	// credentials).
	ErrAuth = errors.New("streams: the NATS server refused the credentials")
	// ErrTLS: the TLS handshake failed (the server's certificate is not trusted, the server refused the
	// client's certificate, or one side requires TLS and the other does not offer it).
	ErrTLS = errors.New("streams: TLS handshake with the NATS server failed")
	// ErrUnreachable: no server answered within the connect timeout (refused, DNS failure, timeout).
	ErrUnreachable = errors.New("streams: NATS server not reachable")
	// ErrInvalidConnConfig: a setting is wrong before any server is asked (a *ConnConfigError).
	ErrInvalidConnConfig = errors.New("streams: invalid connection setting")
)

// ConnConfig says how a component reaches NATS. URL (or InProcess) is required.
type ConnConfig struct {
	URL   string // nats://host:port[,nats://…]; user info in it is never logged (RedactURL)
	Name  string // connection name shown by `nats server report connections`
	Creds string // .creds file (JWT + nkey seed)
	NKey  string // nkey seed file
	User  string
	Pass  string
	Token string
	// TLS: CA to verify the server, and a client certificate for mutual TLS.
	TLSCA   string
	TLSCert string
	TLSKey  string
	// TLSFirst does the TLS handshake before the server's INFO (the server's handshake_first).
	TLSFirst bool
	// InProcess connects to this embedded server without a socket (URL and TLS are ignored); the
	// server checks the credentials as it does for any client.
	InProcess *natsserver.Server
	// ConnectTimeout bounds the wait for the first connection (default DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// Logger receives the connection's events (default slog.Default()).
	Logger *slog.Logger
}

// ConnConfigError is a setting Validate refuses. Field is the ConnConfig field at fault (URL, Creds,
// NKey, User, Pass, TLSCA, TLSCert, TLSKey, ConnectTimeout).
type ConnConfigError struct {
	Field string
	Err   error
}

func (e *ConnConfigError) Error() string { return e.Err.Error() }

// Unwrap returns ErrInvalidConnConfig and the cause.
func (e *ConnConfigError) Unwrap() []error { return []error{ErrInvalidConnConfig, e.Err} }

// ConnectError is a connection that could not be made: where, why (Kind: ErrAuth, ErrTLS or
// ErrUnreachable), what was tried, and the cause as nats.go or the network reported it.
type ConnectError struct {
	URL    string // redacted
	Kind   error
	Detail string // what the client presented or how long it waited
	Err    error
}

func (e *ConnectError) Error() string {
	s := "connect " + e.URL + ": " + strings.TrimPrefix(e.Kind.Error(), "streams: ")
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the kind and the cause, so errors.Is matches both ErrAuth and nats.ErrAuthorization.
func (e *ConnectError) Unwrap() []error { return []error{e.Kind, e.Err} }

// Validate checks every setting that can be checked without a server, with nats.go's own loaders: the
// URLs parse, the credentials file yields a JWT and signs, the nkey seed is a user seed, the CA and the
// client certificate load. A wrong one is a *ConnConfigError naming the field.
func (c ConnConfig) Validate() error {
	bad := func(field, format string, a ...any) error {
		return &ConnConfigError{Field: field, Err: fmt.Errorf(format, a...)}
	}
	if c.ConnectTimeout < 0 {
		return bad("ConnectTimeout", "connect timeout %v is negative", c.ConnectTimeout)
	}
	if c.InProcess == nil {
		if err := validateURLs(c.URL); err != nil {
			return bad("URL", "server URL %q: %v", RedactURL(c.URL), err)
		}
	}
	if c.Pass != "" && c.User == "" {
		return bad("Pass", "a password is set but no user")
	}
	if c.Creds != "" {
		var o nats.Options
		if err := nats.UserCredentials(c.Creds)(&o); err != nil {
			return bad("Creds", "credentials file %q: %v", c.Creds, err)
		}
		if _, err := o.UserJWT(); err != nil {
			return bad("Creds", "credentials file %q: %v", c.Creds, err)
		}
		if _, err := o.SignatureCB([]byte("fpmbus")); err != nil {
			return bad("Creds", "credentials file %q: %v", c.Creds, err)
		}
	}
	if c.NKey != "" {
		if _, err := nats.NkeyOptionFromSeed(c.NKey); err != nil {
			return bad("NKey", "nkey seed file %q: %v", c.NKey, err)
		}
	}
	if c.InProcess != nil {
		return nil
	}
	if c.TLSCA != "" {
		if err := nats.RootCAs(c.TLSCA)(&nats.Options{}); err != nil {
			return bad("TLSCA", "TLS CA %q: %v", c.TLSCA, err)
		}
	}
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		return bad("TLSKey", "a client certificate (%q) needs its key", c.TLSCert)
	case c.TLSKey != "" && c.TLSCert == "":
		return bad("TLSCert", "a client key (%q) needs its certificate", c.TLSKey)
	case c.TLSCert != "":
		if err := nats.ClientCert(c.TLSCert, c.TLSKey)(&nats.Options{}); err != nil {
			return bad("TLSCert", "client certificate %q / key %q: %v", c.TLSCert, c.TLSKey, err)
		}
	}
	return nil
}

// validateURLs checks a comma-separated list of server URLs as nats.go reads them (a bare host:port is
// nats://host:port).
func validateURLs(urls string) error {
	if strings.TrimSpace(urls) == "" {
		return errors.New("empty")
	}
	for _, raw := range strings.Split(urls, ",") {
		s := strings.TrimSpace(raw)
		if !strings.Contains(s, "://") {
			s = "nats://" + s
		}
		u, err := url.Parse(s)
		if err != nil {
			return errors.New("does not parse") // url's error would repeat the URL, password included
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("scheme %q: want nats, tls, ws or wss", u.Scheme)
		}
		if u.Hostname() == "" {
			return errors.New("no host")
		}
		// nats and tls URLs are HOST:PORT, nothing after: "nats//h:4222" parses as host "nats" with a
		// path, and would be looked up in DNS as a host named nats.
		if (u.Scheme == "nats" || u.Scheme == "tls") && (u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "") {
			return fmt.Errorf("a path or query after the host %q: want %s://HOST:PORT (is a ':' missing after the scheme?)",
				u.Hostname(), u.Scheme)
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("port %q: want 1 to 65535", p)
			}
		}
	}
	return nil
}

// Connect is ConnectContext without a context.
func Connect(c ConnConfig) (*nats.Conn, error) { return connectContext(context.Background(), c) }

// connectContext validates c and makes the first connection: attempt after attempt while no server is
// reachable, until c.ConnectTimeout or ctx ends; at once on ErrAuth or ErrTLS. The first failure is
// logged with its cause. The connection then reconnects forever and logs its events.
func connectContext(ctx context.Context, c ConnConfig) (*nats.Conn, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	timeout := c.ConnectTimeout
	if timeout == 0 {
		timeout = DefaultConnectTimeout
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	if c.InProcess != nil {
		// nats.go takes a tls:// URL as "TLS required"; an in-process connection has no TLS to do.
		_, hostPort, _ := strings.Cut(c.InProcess.ClientURL(), "://")
		c.URL = "nats://" + hostPort
	}
	where := c.where()
	opts, err := c.options(log, min(attemptTimeout, timeout))
	if err != nil {
		return nil, &ConnConfigError{Field: "URL", Err: err}
	}
	deadline := time.Now().Add(timeout)
	waits := retrywait.Doubling(100*time.Millisecond, 2*time.Second)
	for attempt := 1; ; attempt++ {
		dialer := &recordingDialer{d: net.Dialer{Timeout: min(attemptTimeout, timeout)}}
		attemptOpts := opts
		if c.InProcess == nil {
			attemptOpts = append(opts[:len(opts):len(opts)], nats.SetCustomDialer(dialer))
		}
		nc, err := nats.Connect(c.URL, attemptOpts...)
		if err == nil {
			if attempt > 1 {
				log.Info("connected to NATS", "server", where, "attempts", attempt)
			}
			return nc, nil
		}
		ce := c.explain(where, err, dialer.last())
		if ce.Kind == ErrUnreachable && c.TLSCert == "" && dialer.requiresClientCert() {
			// The server said it requires a client certificate and none was given: whatever the
			// connection's end looked like, the next attempt would end the same way.
			ce.Kind, ce.Detail = ErrTLS, "the server requires a client certificate (its INFO says tls_verify), and none was given"
		}
		if ce.Kind != ErrUnreachable {
			return nil, ce
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			ce.Detail = fmt.Sprintf("no answer within %v, %d attempts", timeout, attempt)
			return nil, ce
		}
		if attempt == 1 {
			log.Warn("NATS server not reachable yet; retrying", "server", where, "error", ce.Err, "for_up_to", remaining.Round(time.Second))
		} else {
			log.Debug("NATS server still not reachable", "server", where, "error", ce.Err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			ce.Detail = "interrupted while waiting"
			return nil, ce
		case <-time.After(min(waits.NextBackOff(), remaining)):
		}
	}
}

// options are the nats.go options of every attempt: the settings, the reconnect policy and the
// handlers that log the connection's events.
func (c ConnConfig) options(log *slog.Logger, timeout time.Duration) ([]nats.Option, error) {
	where := c.where()
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // the bridge buffers itself, with exact drop accounting
		nats.Timeout(timeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS connection lost; reconnecting", "server", where, "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS connection restored", "server", RedactURL(nc.ConnectedUrl()))
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Debug("NATS reconnect attempt failed", "server", where, "error", err)
		}),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(classify(err), ErrAuth) {
				log.Error("the NATS server refused this client's credentials; refused twice in a row, the connection closes",
					"server", where, "error", err, "credentials", c.describeAuth())
				return
			}
			if errors.Is(err, nats.ErrPermissionViolation) {
				notifyRefusal(nc, err)
				// The server refuses a publish (a JetStream API call is one) or a subscription this
				// user's permissions do not allow. A refused request gets no answer: the operation
				// fails only when its own timeout ends, so this line is where the subject is named.
				log.Error("the NATS server refused this user a subject its permissions do not allow; the operation fails at its timeout",
					"server", where, "error", err, "credentials", c.describeAuth())
				return
			}
			attrs := []any{"server", where, "error", err}
			if sub != nil {
				attrs = append(attrs, "subject", sub.Subject)
			}
			log.Warn("NATS asynchronous error", attrs...)
		}),
		// Closing is the owner's (at the end of a command) or nats.go's (credentials refused twice in a
		// row, a protocol error); the owner says which through OnClosed. The refusal itself was logged
		// above as it happened.
		nats.ClosedHandler(func(nc *nats.Conn) {
			log.Debug("NATS connection closed", "server", where, "last_error", nc.LastError())
		}),
	}
	if c.InProcess != nil {
		opts = append(opts, nats.InProcessServer(c.InProcess))
	}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.NKey != "" {
		o, err := nats.NkeyOptionFromSeed(c.NKey)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Pass))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.InProcess != nil {
		return opts, nil // no socket, no TLS
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" || c.TLSKey != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	if c.TLSFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	return opts, nil
}

// where names the server in logs and errors, without secrets.
func (c ConnConfig) where() string {
	if c.InProcess != nil {
		return "in-process " + c.InProcess.ClientURL()
	}
	return RedactURL(c.URL)
}

// explain turns a failed attempt into a ConnectError. nats.go reports "no servers available" when every
// server refused the TCP connection; the dialer's own error says so.
func (c ConnConfig) explain(where string, err, dialErr error) *ConnectError {
	if errors.Is(err, nats.ErrNoServers) && dialErr != nil {
		err = dialErr
	}
	ce := &ConnectError{URL: where, Kind: classify(err), Err: err}
	switch ce.Kind {
	case ErrAuth:
		ce.Detail = "presented: " + c.describeAuth()
	case ErrTLS:
		var unknown x509.UnknownAuthorityError
		var remote *net.OpError
		switch {
		case errors.As(err, &unknown) && c.TLSCA == "":
			ce.Detail = "the server's certificate is signed by an authority this host does not trust, and no CA was given"
		case errors.As(err, &unknown):
			ce.Detail = fmt.Sprintf("the server's certificate is not signed by the CA %s", c.TLSCA)
		case errors.As(err, &remote) && remote.Op == "remote error" && c.TLSCert == "":
			ce.Detail = "the server refused the handshake; it may require a client certificate, and none was given"
		case errors.As(err, &remote) && remote.Op == "remote error":
			ce.Detail = fmt.Sprintf("the server refused the handshake; it may not accept the client certificate %s", c.TLSCert)
		}
	}
	return ce
}

// classify says why a connection attempt failed: ErrAuth, ErrTLS or ErrUnreachable.
func classify(err error) error {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		remote   *net.OpError
	)
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return ErrAuth
	case errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted),
		errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &record),
		// A TLS alert from the server (crypto/tls reports it as a "remote error").
		errors.As(err, &remote) && remote.Op == "remote error":
		return ErrTLS
	}
	return ErrUnreachable
}

// describeAuth says which credentials the client presents, never their secret part.
func (c ConnConfig) describeAuth() string {
	var parts []string
	if c.Creds != "" {
		parts = append(parts, "credentials file "+c.Creds)
	}
	if c.NKey != "" {
		parts = append(parts, "nkey seed file "+c.NKey)
	}
	if c.User != "" {
		p := fmt.Sprintf("user %q", c.User)
		if c.Pass != "" {
			p += " with a password"
		} else {
			p += " without a password"
		}
		parts = append(parts, p)
	}
	if c.Token != "" {
		parts = append(parts, "a token")
	}
	if c.InProcess == nil && strings.Contains(c.URL, "@") {
		parts = append(parts, "user info in the server URL")
	}
	if len(parts) == 0 {
		return "no credentials"
	}
	return strings.Join(parts, ", ")
}

// recordingDialer dials like nats.go's default dialer and keeps the last error, which nats.go replaces
// by "no servers available" when the server refused the connection, and the last address it reached.
// It returns the connection itself: nats.go reads it for the connection's life, and nothing of
// fpmbus's sits on that path.
type recordingDialer struct {
	d       net.Dialer
	mu      sync.Mutex
	err     error
	reached string
}

func (r *recordingDialer) Dial(network, address string) (net.Conn, error) {
	conn, err := r.d.Dial(network, address)
	r.mu.Lock()
	if err != nil {
		r.err = err
	} else {
		r.reached = address
	}
	r.mu.Unlock()
	return conn, err
}

func (r *recordingDialer) last() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// requiresClientCert says whether the server the last attempt reached requires a client certificate.
// Under load, such a server's refusal of a client without one can reach the client as a connection
// closed without a word, which would otherwise look like a server that is not reachable yet and be
// retried until the timeout. The server says so in its INFO line, sent in the clear before the TLS
// upgrade: read on a connection of its own, made only after such an attempt (a server set to
// handshake first sends none, and a server that does not answer within infoProbeTimeout is taken
// not to require one).
func (r *recordingDialer) requiresClientCert() bool {
	r.mu.Lock()
	address := r.reached
	r.mu.Unlock()
	if address == "" {
		return false
	}
	d := r.d
	d.Timeout = min(d.Timeout, infoProbeTimeout)
	conn, err := d.Dial("tcp", address)
	if err != nil {
		return false
	}
	defer conn.Close()
	if conn.SetReadDeadline(time.Now().Add(infoProbeTimeout)) != nil {
		return false
	}
	line, err := bufio.NewReaderSize(conn, maxInfoLine).ReadSlice('\n')
	if err != nil {
		return false
	}
	body, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("INFO "))
	var info struct {
		TLSVerify bool `json:"tls_verify"`
	}
	return ok && json.Unmarshal(body, &info) == nil && info.TLSVerify
}

// maxInfoLine bounds the INFO line read; a real one is a few hundred bytes (a cluster's connect_urls
// make it longer).
const maxInfoLine = 64 << 10

// infoProbeTimeout bounds requiresClientCert's connection and read.
const infoProbeTimeout = time.Second

// OnClosed calls f once, with the connection's last error (nil after a Close by its owner), when nc is
// closed for good: at once if it is closed already. It keeps the handler nc had.
func OnClosed(nc *nats.Conn, f func(cause error)) {
	var once sync.Once
	call := func() { once.Do(func() { f(nc.LastError()) }) }
	prev := nc.ClosedHandler()
	nc.SetClosedHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		call()
	})
	if nc.IsClosed() {
		call()
	}
}
