package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/streams"
)

// The connection flags: how a command reaches an external NATS server, at parity with the nats CLI
// (same variables, --nkey, --tls-first, --context). Where a setting comes from, highest first: its flag,
// its variable, the nats CLI context named by --context (NATS_CONTEXT), the built-in default. A secret
// (--password, --token, user info in --server) is never shown: -h says only that it is set and from
// which variable, and URLs are logged redacted (natsconn.RedactURL). Every file the flags name is
// loaded before the first connection attempt; a wrong one exits 2 naming the flag or variable.

// connOptions holds the connection flags of one command.
type connOptions struct {
	fs             *flag.FlagSet
	name           string
	url            string
	creds          string
	nkey           string
	user           string
	password       string
	token          string
	tlsCA          string
	tlsCert        string
	tlsKey         string
	tlsFirst       bool
	context        string
	connectTimeout time.Duration
	fromEnv        map[string]string // flag name → the variable its default came from
}

// connFlags registers the connection flags; name names the connection (fpmbus-<name>).
func connFlags(fs *flag.FlagSet, name string) *connOptions {
	return connFlagsWaiting(fs, name, natsconn.DefaultConnectTimeout)
}

// readOnlyConnTimeout is the default --connect-timeout of the commands that only read (a report, a
// listing): a person waiting for an answer learns at once that no server is there.
const readOnlyConnTimeout = 5 * time.Second

// readConnFlags registers the connection flags of a command that only reads: they wait
// readOnlyConnTimeout for the server by default.
func readConnFlags(fs *flag.FlagSet, name string) *connOptions {
	return connFlagsWaiting(fs, name, readOnlyConnTimeout)
}

// connFlagsWaiting registers the connection flags with wait as the default --connect-timeout.
func connFlagsWaiting(fs *flag.FlagSet, name string, wait time.Duration) *connOptions {
	o := &connOptions{fs: fs, name: name, fromEnv: map[string]string{}}
	inFlagGroup(fs, "connection to NATS", func() {
		o.text(&o.url, "server", "NATS_URL", "nats://127.0.0.1:4222", "NATS server `URL`(s), comma-separated")
		o.credentialFlags()
		o.text(&o.tlsCA, "tls-ca", "NATS_CA", "", "CA certificate to verify the server")
		o.text(&o.tlsCert, "tls-cert", "NATS_CERT", "", "client certificate for mutual TLS (with --tls-key)")
		o.text(&o.tlsKey, "tls-key", "NATS_KEY", "", "client key for mutual TLS (with --tls-cert)")
		fs.BoolVar(&o.tlsFirst, "tls-first", false, "do the TLS handshake before the server's greeting (a server with handshake_first)")
		o.text(&o.context, "context", "NATS_CONTEXT", "", "nats CLI context to read the settings from ($XDG_CONFIG_HOME/nats/context/NAME.json, or a .json path); flags and variables override it")
		fs.DurationVar(&o.connectTimeout, "connect-timeout", wait, "how long to wait for the server at start; refused credentials and failed TLS handshakes end the wait at once")
	})
	return o
}

// credentialFlags registers only the flags that say who the client is: `fpmbus up` takes these for its
// components, which connect in-process to its embedded server (no URL, no TLS).
func credentialFlags(fs *flag.FlagSet, name string) *connOptions {
	o := &connOptions{fs: fs, name: name, fromEnv: map[string]string{}}
	o.credentialFlags()
	return o
}

// credentials returns the checked credentials of flags registered by credentialFlags; a bad value is a
// usage error naming its flag or variable.
func (o *connOptions) credentials() (natsconn.ConnConfig, error) {
	c := natsconn.ConnConfig{Name: "fpmbus-" + o.name, Logger: slog.Default(),
		Creds: o.creds, NKey: o.nkey, User: o.user, Pass: o.password, Token: o.token}
	check := c
	check.URL = "nats://" + natsserver.DefaultListen // Validate wants one; the in-process connection has none
	if err := check.Validate(); err != nil {
		var ce *natsconn.ConnConfigError
		if errors.As(err, &ce) {
			return c, fmt.Errorf("%w: %s: %v", errUsage, o.source(fieldFlags[ce.Field], false, ""), ce.Err)
		}
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}

// givenCredentials lists the credential flags set on the command line.
func (o *connOptions) givenCredentials() []string {
	var given []string
	for _, name := range []string{"creds", "nkey", "user", "password", "token"} {
		if flagGiven(o.fs, name) {
			given = append(given, "--"+name)
		}
	}
	return given
}

func (o *connOptions) credentialFlags() {
	o.text(&o.creds, "creds", "NATS_CREDS", "", "NATS credentials file (JWT and nkey seed)")
	o.text(&o.nkey, "nkey", "NATS_NKEY", "", "NATS nkey seed file")
	o.text(&o.user, "user", "NATS_USER", "", "NATS user")
	o.secret(&o.password, "password", "NATS_PASSWORD", "NATS `password` (with --user)")
	o.secret(&o.token, "token", "NATS_TOKEN", "NATS `token`")
}

// text registers a text flag whose default is variable env, else def; a URL flag shows its default
// redacted.
func (o *connOptions) text(dst *string, name, env, def, usage string) {
	*dst = def
	if v := envOr(env, ""); v != "" {
		*dst, o.fromEnv[name] = v, env
	}
	usage += " (env " + env + ")"
	if name == "server" {
		o.fs.Var(&urlValue{dst}, name, usage)
		return
	}
	o.fs.StringVar(dst, name, *dst, usage)
}

// secret registers a flag holding a secret: its value is never shown, only where it was set from.
func (o *connOptions) secret(dst *string, name, env, usage string) {
	usage += " (env " + env + ")"
	if v := envOr(env, ""); v != "" {
		*dst, o.fromEnv[name] = v, env
		usage += " (default: set from " + env + ")"
	}
	o.fs.Var(&secretValue{dst}, name, usage)
}

// secretValue is a flag.Value that never shows its value: flag prints no default for it.
type secretValue struct{ v *string }

func (s *secretValue) String() string { return "" }

func (s *secretValue) Set(v string) error { *s.v = v; return nil }

// urlValue is a flag.Value for server URLs that shows them redacted.
type urlValue struct{ v *string }

func (u *urlValue) String() string {
	if u == nil || u.v == nil {
		return ""
	}
	return natsconn.RedactURL(*u.v)
}

func (u *urlValue) Set(v string) error { *u.v = v; return nil }

// source names where the value of flag name came from, for messages.
func (o *connOptions) source(name string, fromContext bool, ctxPath string) string {
	switch {
	case flagGiven(o.fs, name):
		return "--" + name
	case o.fromEnv[name] != "":
		return o.fromEnv[name] + " (default of --" + name + ")"
	case fromContext:
		return fmt.Sprintf("--context %s (%s)", o.context, ctxPath)
	}
	return "--" + name
}

// fieldFlags maps a natsconn.ConnConfig field to the flag that sets it.
var fieldFlags = map[string]string{
	"URL": "server", "Creds": "creds", "NKey": "nkey", "User": "user", "Pass": "password",
	"TLSCA": "tls-ca", "TLSCert": "tls-cert", "TLSKey": "tls-key", "ConnectTimeout": "connect-timeout",
}

// config resolves flags, variables and context into a checked natsconn.ConnConfig; a bad value is a
// usage error naming its flag, variable or context.
func (o *connOptions) config() (natsconn.ConnConfig, error) {
	c := natsconn.ConnConfig{Name: "fpmbus-" + o.name, ConnectTimeout: o.connectTimeout, Logger: slog.Default(),
		URL: o.url, Creds: o.creds, NKey: o.nkey, User: o.user, Pass: o.password, Token: o.token,
		TLSCA: o.tlsCA, TLSCert: o.tlsCert, TLSKey: o.tlsKey, TLSFirst: o.tlsFirst}
	if o.connectTimeout <= 0 {
		return c, fmt.Errorf("%w: --connect-timeout %v: want a positive duration", errUsage, o.connectTimeout)
	}
	fromContext := map[string]bool{}
	ctxPath := ""
	if o.context != "" {
		nctx, err := natsconn.LoadNATSContext(o.context)
		if err != nil {
			return c, fmt.Errorf("%w: %s: %v", errUsage, o.source("context", false, ""), err)
		}
		ctxPath = nctx.Path
		given := func(name string) bool { return flagGiven(o.fs, name) || o.fromEnv[name] != "" }
		for _, f := range []struct {
			flag string
			dst  *string
			v    string
		}{
			{"server", &c.URL, nctx.URL}, {"creds", &c.Creds, nctx.Creds}, {"nkey", &c.NKey, nctx.NKey},
			{"user", &c.User, nctx.User}, {"password", &c.Pass, nctx.Password}, {"token", &c.Token, nctx.Token},
			{"tls-ca", &c.TLSCA, nctx.CA}, {"tls-cert", &c.TLSCert, nctx.Cert}, {"tls-key", &c.TLSKey, nctx.Key},
		} {
			if f.v != "" && !given(f.flag) {
				*f.dst, fromContext[f.flag] = f.v, true
			}
		}
		if nctx.TLSFirst && !flagGiven(o.fs, "tls-first") {
			c.TLSFirst = true
		}
	}
	if err := c.Validate(); err != nil {
		var ce *natsconn.ConnConfigError
		if errors.As(err, &ce) {
			name := fieldFlags[ce.Field]
			return c, fmt.Errorf("%w: %s: %v", errUsage, o.source(name, fromContext[name], ctxPath), ce.Err)
		}
		return c, fmt.Errorf("%w: %v", errUsage, err)
	}
	return c, nil
}

// connectHint says which flags to check for a connection that failed for the reason err gives.
func connectHint(err error, credentialFlags string) string {
	switch {
	case errors.Is(err, natsconn.ErrAuth):
		return "check the credentials: " + credentialFlags
	case errors.Is(err, natsconn.ErrTLS):
		return "check the TLS settings: --tls-ca (NATS_CA), --tls-cert/--tls-key (NATS_CERT/NATS_KEY), --tls-first"
	case errors.Is(err, natsconn.ErrUnreachable):
		return "check --server (NATS_URL) and that the server runs; --connect-timeout waits longer"
	}
	return ""
}

// connectCredentialFlags are the flags and variables that say who a client is, for hints.
const connectCredentialFlags = "--user/--password (NATS_USER/NATS_PASSWORD), --token (NATS_TOKEN), --creds (NATS_CREDS), --nkey (NATS_NKEY), --context (NATS_CONTEXT)"

// connectAndApply connects to NATS, opens JetStream and ensures the streams exist (within 30 s; an
// existing stream is used as it is): how every command that runs against an external server starts. A
// nil scfg ensures nothing (commands that only read, or whose component ensures what it needs itself).
// The caller closes the connection.
func connectAndApply(ctx context.Context, conn *connOptions, scfg *streams.Config) (*nats.Conn, jetstream.JetStream, error) {
	cfg, err := conn.config()
	if err != nil {
		return nil, nil, err
	}
	return connectConfigAndApply(ctx, cfg, scfg, connectCredentialFlags)
}

// connectConfigAndApply is connectAndApply on a resolved configuration; a failed connection says which
// flags to check (credentialFlags for refused credentials).
func connectConfigAndApply(ctx context.Context, cfg natsconn.ConnConfig, scfg *streams.Config, credentialFlags string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := natsconn.ConnectContext(ctx, cfg)
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

// errConnClosed is the failure of a connection that closed for good (the server refused the
// credentials twice in a row, or a protocol error): nats.go does not reconnect it.
var errConnClosed = errors.New("nats connection closed for good")

// watchConn runs a long-lived component on nc: the context it returns ends when ctx does or when nc
// closes for good, and finish, given what the component's run returned, reports the closed connection
// with its cause (exit status 1, so a service manager restarts the command) instead of the run's own
// view of it. A component never runs on, retrying forever, on a connection that cannot come back.
func watchConn(ctx context.Context, nc *nats.Conn) (context.Context, func(runErr error) error) {
	cctx, cancel := context.WithCancelCause(ctx)
	natsconn.OnClosed(nc, func(cause error) {
		if cause == nil {
			cause = nats.ErrConnectionClosed
		}
		cancel(fmt.Errorf("%w: %w", errConnClosed, cause))
	})
	return cctx, func(runErr error) error {
		defer cancel(nil)
		if ctx.Err() == nil {
			if cause := context.Cause(cctx); errors.Is(cause, errConnClosed) {
				return cause
			}
		}
		return runErr
	}
}
