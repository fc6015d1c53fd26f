package natsconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// connectHint says which flags to check for a connection that failed for the reason err gives.
func connectHint(err error, credentialFlags string) string {
	switch {
	case errors.Is(err, ErrAuth):
		return "check the credentials: " + credentialFlags
	case errors.Is(err, ErrTLS):
		return "check the TLS settings: --tls-ca (NATS_CA), --tls-cert/--tls-key (NATS_CERT/NATS_KEY), --tls-first"
	case errors.Is(err, ErrUnreachable):
		return "check --server (NATS_URL) and that the server runs; --connect-timeout waits longer"
	}
	return ""
}

// CredentialFlags are the flags and variables that say who a client is, for hints.
const CredentialFlags = "--user/--password (NATS_USER/NATS_PASSWORD), --token (NATS_TOKEN), --creds (NATS_CREDS), --nkey (NATS_NKEY), --context (NATS_CONTEXT)"

// ConnectAndEnsure connects to NATS, opens JetStream and ensures the streams exist (within 30 s; an
// existing stream is used as it is): how every command that runs against a server starts. A nil scfg
// ensures nothing (commands that only read, or whose component ensures what it needs itself). A failed
// connection says which flags to check (credentialFlags for refused credentials). The caller closes
// the connection.
func ConnectAndEnsure(ctx context.Context, cfg ConnConfig, scfg *streams.Config, credentialFlags string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := connectContext(ctx, cfg)
	if err != nil {
		if hint := connectHint(err, credentialFlags); hint != "" {
			return nil, nil, fmt.Errorf("%w; %s", err, hint)
		}
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if scfg == nil {
		return nc, js, nil
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := streams.Ensure(actx, js, *scfg, slog.Default()); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// ErrConnClosed is the failure of a connection that closed for good (the server refused the
// credentials twice in a row, or a protocol error): nats.go does not reconnect it.
var ErrConnClosed = errors.New("nats connection closed for good")

// Watch runs a long-lived component on nc: the context it returns ends when ctx does or when nc closes
// for good, and finish, given what the component's run returned, reports the closed connection with
// its cause (so that the command exits 1 and a service manager restarts it) instead of the run's own
// view of it. A component never runs on, retrying forever, on a connection that cannot come back.
func Watch(ctx context.Context, nc *nats.Conn) (context.Context, func(runErr error) error) {
	cctx, cancel := context.WithCancelCause(ctx)
	OnClosed(nc, func(cause error) {
		if cause == nil {
			cause = nats.ErrConnectionClosed
		}
		cancel(fmt.Errorf("%w: %w", ErrConnClosed, cause))
	})
	return cctx, func(runErr error) error {
		defer cancel(nil)
		if ctx.Err() == nil {
			if cause := context.Cause(cctx); errors.Is(cause, ErrConnClosed) {
				return cause
			}
		}
		return runErr
	}
}
