package streams

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnConfig says how a component reaches NATS. Only URL is required.
type ConnConfig struct {
	URL   string // nats://host:port[,nats://…]
	Name  string // connection name shown by `nats server report connections`
	Creds string // .creds file (JWT + nkey)
	User  string
	Pass  string
	Token string
	// TLS: CA to verify the server, and a client certificate for mutual TLS.
	TLSCA   string
	TLSCert string
	TLSKey  string
}

// Connect dials NATS and keeps reconnecting forever: a component outlives broker restarts.
func Connect(c ConnConfig) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // the bridge buffers itself, with exact drop accounting
		nats.RetryOnFailedConnect(true),
		nats.Timeout(5 * time.Second),
	}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Pass))
	}
	if c.Token != "" {
		opts = append(opts, nats.Token(c.Token))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" || c.TLSKey != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("streams: connect %s: %w", c.URL, err)
	}
	return nc, nil
}
