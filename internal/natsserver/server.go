package natsserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultListen is where the embedded server listens: loopback only, the standard NATS port, so the
// `nats` CLI works with its defaults.
const DefaultListen = "127.0.0.1:4222"

// DefaultMaxPayload of the embedded server. FPMs are < 1 KiB; benchmark artefacts are tens of MiB and go
// through FPM_BENCH, so the embedded server allows 8 MiB messages (NATS's recommended ceiling).
const DefaultMaxPayload = 8 << 20

// DefaultPingInterval and DefaultMaxPingsOut bound how long the embedded server keeps the connection of
// a client that stopped answering (a process frozen by SIGSTOP, a paused VM, a host gone without
// closing its sockets): closed after about (DefaultMaxPingsOut+1) x DefaultPingInterval, 30 s, where
// nats-server's defaults (2 min, 2) take about 6 min. Until the server closes it, such a client keeps
// the subscriptions it had, and a consumer group partition owned by a frozen member cannot move: the
// server does not move a push consumer's subject while it has a subscriber. A server configuration
// (ServerConfig.Base) that sets ping_interval or ping_max keeps its own values.
const (
	DefaultPingInterval = 10 * time.Second
	DefaultMaxPingsOut  = 2
)

// errServerNotReady is returned when the embedded server does not accept connections in time.
var errServerNotReady = errors.New("streams: embedded server not ready")

// ServerConfig configures the embedded JetStream server.
//
// Authentication and TLS: Base carries a nats-server configuration file as the real server reads it
// (accounts, users, nkeys, TLS, …); AuthToken and the TLS fields cover the common case without one. The
// embedded server owns what fpmbus must own: the JetStream store is always StoreDir, and the client
// address is Listen when it is set. Without authentication the server accepts any client: Options
// reports whether it authenticates, and `fpmbus up` refuses to listen beyond loopback without it.
type ServerConfig struct {
	// Listen is host:port for clients; port 0 picks a free one (tests). Empty: Base's listen address if
	// it sets one, else DefaultListen (never every interface by default).
	Listen string
	// StoreDir is the JetStream store directory (created if missing). Required.
	StoreDir string
	// Name is the server name (default: Base's, else "fpmbus").
	Name string
	// MaxPayload bounds one message (default: Base's, else DefaultMaxPayload).
	MaxPayload int32
	// Logging routes the server's own log lines to stderr.
	Logging bool
	// Base is a nats-server configuration (LoadServerConfig); nil: none.
	Base *server.Options
	// AuthToken makes every client present this token. Not with a Base that authenticates already.
	AuthToken string
	// TLSCert and TLSKey are the server's certificate and key: clients must then use TLS. With
	// TLSClientCA they must also present a certificate signed by it (mutual TLS, which authenticates).
	// Not with a Base that configures TLS already.
	TLSCert     string
	TLSKey      string
	TLSClientCA string
	// Sync is when the server fsyncs what it stores (see SyncPolicy). Zero: a Base's sync_interval if it
	// sets one, else DefaultSync (always).
	Sync SyncPolicy
}

// Server is an embedded nats-server with JetStream enabled. Shutdown stops it; the store stays on disk.
// WatchStore watches its store (storewatch.go).
type Server struct {
	ns    *server.Server
	watch *storeWatch
}

// LoadServerConfig reads a nats-server configuration file with nats-server's own loader (includes,
// variables, accounts, users, nkeys, TLS): exactly what `nats-server -c FILE` would run.
func LoadServerConfig(path string) (*server.Options, error) {
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("streams: server configuration %s: %w", path, err)
	}
	return o, nil
}

// Options returns the nats-server options cfg runs with: Base (or none), then what fpmbus owns and the
// settings of cfg. It is what StartServer runs, so a caller can check it (Authenticates,
// ListensOnLoopback) before starting anything.
func (cfg ServerConfig) Options() (*server.Options, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("streams: embedded server needs a store directory")
	}
	o := &server.Options{}
	if cfg.Base != nil {
		o = cfg.Base.Clone()
	}
	switch {
	case cfg.Listen != "":
		host, port, err := splitListen(cfg.Listen)
		if err != nil {
			return nil, err
		}
		o.Host, o.Port = host, port
	case cfg.Base == nil || o.Host == "" && o.Port == 0:
		o.Host, o.Port, _ = splitListen(DefaultListen)
	}
	if cfg.Name != "" || o.ServerName == "" {
		o.ServerName = cmp.Or(cfg.Name, "fpmbus")
	}
	if cfg.MaxPayload != 0 || o.MaxPayload == 0 {
		o.MaxPayload = cmp.Or(cfg.MaxPayload, DefaultMaxPayload)
	}
	if o.PingInterval == 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.MaxPingsOut == 0 {
		o.MaxPingsOut = DefaultMaxPingsOut
	}
	o.JetStream, o.StoreDir = true, cfg.StoreDir
	o.NoSigs, o.NoLog = true, !cfg.Logging
	if cfg.AuthToken != "" {
		if Authenticates(o) || o.NoAuthUser != "" {
			return nil, errors.New("streams: an auth token and a server configuration that sets authentication already: use one")
		}
		o.Authorization = cfg.AuthToken
	}
	switch {
	case cfg.TLSCert == "" && cfg.TLSKey == "" && cfg.TLSClientCA == "":
	case o.TLSConfig != nil:
		return nil, errors.New("streams: a server certificate and a server configuration that sets TLS already: use one")
	case cfg.TLSCert == "" || cfg.TLSKey == "":
		return nil, errors.New("streams: the server's TLS needs both a certificate and its key")
	default:
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey,
			CaFile: cfg.TLSClientCA, Verify: cfg.TLSClientCA != ""})
		if err != nil {
			return nil, fmt.Errorf("streams: server TLS (certificate %s, key %s, client CA %q): %w", cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, err)
		}
		o.TLSConfig, o.TLSVerify = tc, cfg.TLSClientCA != ""
		o.TLSTimeout = float64(server.TLS_TIMEOUT) / float64(time.Second)
	}
	return o, nil
}

// splitListen parses host:port; port 0 is any free port.
func splitListen(listen string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("streams: listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("streams: listen address %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// Authenticates reports whether a server with options o makes every client prove who it is: a token,
// users (passwords, nkeys, certificates), operators (JWTs), mutual TLS or an auth callout, and no
// no_auth_user (which lets a client without credentials in as that user).
func Authenticates(o *server.Options) bool {
	if o.NoAuthUser != "" {
		return false
	}
	mutualTLS := o.TLSVerify || o.TLSConfig != nil && o.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert
	return o.Authorization != "" || o.Username != "" || len(o.Users) > 0 || len(o.Nkeys) > 0 ||
		len(o.TrustedOperators) > 0 || len(o.TrustedKeys) > 0 || mutualTLS ||
		o.CustomClientAuthentication != nil || o.AuthCallout != nil
}

// ListensOnLoopback reports whether the client listener of o is reachable from this host only.
func ListensOnLoopback(o *server.Options) bool { return IsLoopbackHost(o.Host) }

// IsLoopbackHost reports whether host (a name or an address, from host:port) is this host only. The
// empty host, 0.0.0.0 and :: are every interface; a name other than localhost counts as remote.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// StartServer starts an embedded server and waits until it accepts connections. An address it cannot
// listen on is an error wrapping ErrListen (a *ListenError), returned before anything starts.
func StartServer(cfg ServerConfig) (*Server, error) {
	opts, err := cfg.Options()
	if err != nil {
		return nil, err
	}
	if err := CheckListen(opts); err != nil {
		return nil, fmt.Errorf("streams: embedded server: %w", err)
	}
	// A configuration file's sync_interval stands unless Sync says otherwise; with neither, DefaultSync.
	if cfg.Sync != (SyncPolicy{}) || cfg.Base == nil || !cfg.Base.SyncAlways && cfg.Base.SyncInterval == 0 {
		cfg.Sync.applyTo(opts)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("streams: embedded server: %w", err)
	}
	if cfg.Logging {
		ns.ConfigureLogger()
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("%w: listening on %s", errServerNotReady, net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	}
	w, err := newStoreWatch(ns, cfg.StoreDir, opts.JetStreamMaxStore <= 0)
	if err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, err
	}
	return &Server{ns: ns, watch: w}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// NATS exposes the underlying server (tests use it to inspect or restart).
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops accepting clients, flushes JetStream to disk and waits for the server to exit or ctx
// to end, whichever comes first.
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		s.watch.close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("streams: embedded server shutdown: %w", ctx.Err())
	}
}
