package streams

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultListen is where the embedded server listens: loopback only, the standard NATS port, so the
// `nats` CLI works with its defaults.
const DefaultListen = "127.0.0.1:4222"

// DefaultMaxPayload of the embedded server. FPMs are < 1 KiB; benchmark artefacts are tens of MiB and go
// through FPM_BENCH, so the embedded server allows 8 MiB messages (NATS's recommended ceiling).
const DefaultMaxPayload = 8 << 20

// ErrServerNotReady is returned when the embedded server does not accept connections in time.
var ErrServerNotReady = errors.New("streams: embedded server not ready")

// ServerConfig configures the embedded JetStream server.
type ServerConfig struct {
	// Listen is host:port for clients; port 0 picks a free one (tests). Default DefaultListen.
	Listen string
	// StoreDir is the JetStream store directory (created if missing). Required.
	StoreDir string
	// Name is the server name (default "fpmbus").
	Name string
	// MaxPayload bounds one message (default DefaultMaxPayload).
	MaxPayload int32
	// Logging routes the server's own log lines to stderr.
	Logging bool
	// Sync is when the server fsyncs what it stores (default DefaultSync: always; see SyncPolicy).
	Sync SyncPolicy
}

// Server is an embedded nats-server with JetStream enabled. Shutdown stops it; the store stays on disk.
type Server struct {
	ns *server.Server
}

// StartServer starts an embedded server and waits until it accepts connections.
func StartServer(cfg ServerConfig) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("streams: embedded server needs a store directory")
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("streams: listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("streams: listen address %q: bad port", cfg.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if cfg.Name == "" {
		cfg.Name = "fpmbus"
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	opts := &server.Options{
		ServerName: cfg.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		MaxPayload: cfg.MaxPayload,
		NoSigs:     true,
		NoLog:      !cfg.Logging,
	}
	cfg.Sync.applyTo(opts)
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
		return nil, fmt.Errorf("%w: listening on %s", ErrServerNotReady, cfg.Listen)
	}
	return &Server{ns: ns}, nil
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
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("streams: embedded server shutdown: %w", ctx.Err())
	}
}
