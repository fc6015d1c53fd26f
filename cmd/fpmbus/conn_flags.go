package main

import (
	"context"
	"flag"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/flaghelp"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/streams"
)

// connOptions holds the connection flags of one command (internal/natsconn defines them); its errors
// are usage errors.
type connOptions struct{ *natsconn.Flags }

// connFlags registers the connection flags; name names the connection (fpmbus-<name>).
func connFlags(fs *flag.FlagSet, name string) *connOptions {
	return connFlagsWaiting(fs, name, natsconn.DefaultConnectTimeout)
}

// readOnlyConnTimeout is the default --connect-timeout of the commands that only read.
const readOnlyConnTimeout = natsconn.ReadOnlyConnectTimeout

// readConnFlags registers the connection flags of a command that only reads: they wait
// readOnlyConnTimeout for the server by default.
func readConnFlags(fs *flag.FlagSet, name string) *connOptions {
	return connFlagsWaiting(fs, name, readOnlyConnTimeout)
}

// connFlagsWaiting registers the connection flags with wait as the default --connect-timeout.
func connFlagsWaiting(fs *flag.FlagSet, name string, wait time.Duration) *connOptions {
	o := &connOptions{}
	flaghelp.InGroup(fs, "connection to NATS", func() { o.Flags = natsconn.RegisterFlags(fs, name, wait) })
	return o
}

// credentialFlags registers only the flags that say who the client is (`fpmbus up`'s components).
func credentialFlags(fs *flag.FlagSet, name string) *connOptions {
	return &connOptions{natsconn.RegisterCredentialFlags(fs, name)}
}

// credentials returns the checked credentials of flags registered by credentialFlags.
func (o *connOptions) credentials() (natsconn.ConnConfig, error) {
	c, err := o.Credentials()
	return c, flagUsage(err)
}

// config resolves flags, variables and context into a checked natsconn.ConnConfig.
func (o *connOptions) config() (natsconn.ConnConfig, error) {
	c, err := o.Config()
	return c, flagUsage(err)
}

// connectAndApply connects to NATS, opens JetStream and ensures the streams scfg declares (nil:
// none), as natsconn.ConnectAndEnsure. The caller closes the connection.
func connectAndApply(ctx context.Context, conn *connOptions, scfg *streams.Config) (*nats.Conn, jetstream.JetStream, error) {
	cfg, err := conn.config()
	if err != nil {
		return nil, nil, err
	}
	return natsconn.ConnectAndEnsure(ctx, cfg, scfg, natsconn.CredentialFlags)
}
