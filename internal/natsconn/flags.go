package natsconn

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/invalid"
)

// The connection flags: how a command reaches an external NATS server, at parity with the nats CLI
// (same variables, --nkey, --tls-first, --context). Where a setting comes from, highest first: its flag,
// its variable, the nats CLI context named by --context (NATS_CONTEXT), the built-in default. A secret
// (--password, --token, user info in --server) is never shown: -h says only that it is set and from
// which variable, and URLs are logged redacted (RedactURL). Every file the flags name is loaded before
// the first connection attempt; a wrong one is an invalid.FlagError naming the flag or variable.

// ReadOnlyConnectTimeout is the default --connect-timeout of the commands that only read (a report, a
// listing): a person waiting for an answer learns at once that no server is there.
const ReadOnlyConnectTimeout = 5 * time.Second

// Flags holds the connection flags of one command.
type Flags struct {
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

// RegisterFlags registers the connection flags on fs with wait as the default --connect-timeout; name
// names the connection (fpmbus-<name>).
func RegisterFlags(fs *flag.FlagSet, name string, wait time.Duration) *Flags {
	o := &Flags{fs: fs, name: name, fromEnv: map[string]string{}}
	o.text(&o.url, "server", "NATS_URL", "nats://127.0.0.1:4222", "NATS server `URL`(s), comma-separated")
	o.credentialFlags()
	o.text(&o.tlsCA, "tls-ca", "NATS_CA", "", "CA certificate to verify the server")
	o.text(&o.tlsCert, "tls-cert", "NATS_CERT", "", "client certificate for mutual TLS (with --tls-key)")
	o.text(&o.tlsKey, "tls-key", "NATS_KEY", "", "client key for mutual TLS (with --tls-cert)")
	fs.BoolVar(&o.tlsFirst, "tls-first", false, "do the TLS handshake before the server's greeting (a server with handshake_first)")
	o.text(&o.context, "context", "NATS_CONTEXT", "", "nats CLI context to read the settings from ($XDG_CONFIG_HOME/nats/context/NAME.json, or a .json path); flags and variables override it")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", wait, "how long to wait for the server at start; refused credentials and failed TLS handshakes end the wait at once")
	return o
}

// RegisterCredentialFlags registers only the flags that say who the client is: `fpmbus up` takes these
// for its components, which connect in-process to its embedded server (no URL, no TLS).
func RegisterCredentialFlags(fs *flag.FlagSet, name string) *Flags {
	o := &Flags{fs: fs, name: name, fromEnv: map[string]string{}}
	o.credentialFlags()
	return o
}

// SetConnectTimeout changes the wait for the server that --connect-timeout's default set (a command
// that decides only after parsing that it only reads).
func (o *Flags) SetConnectTimeout(d time.Duration) { o.connectTimeout = d }

// Credentials returns the checked credentials of flags registered by RegisterCredentialFlags; a bad
// value is an invalid.FlagError naming its flag or variable.
func (o *Flags) Credentials() (ConnConfig, error) {
	c := ConnConfig{Name: "fpmbus-" + o.name, Logger: slog.Default(),
		Creds: o.creds, NKey: o.nkey, User: o.user, Pass: o.password, Token: o.token}
	check := c
	check.URL = "nats://127.0.0.1:4222" // Validate wants one; the in-process connection has none
	if err := check.Validate(); err != nil {
		var ce *ConnConfigError
		if errors.As(err, &ce) {
			return c, invalid.Flagf("%s: %v", o.source(fieldFlags[ce.Field], false, ""), ce.Err)
		}
		return c, invalid.Flagf("%v", err)
	}
	return c, nil
}

// GivenCredentials lists the credential flags set on the command line.
func (o *Flags) GivenCredentials() []string {
	var given []string
	for _, name := range []string{"creds", "nkey", "user", "password", "token"} {
		if flagprefix.Given(o.fs, name) {
			given = append(given, "--"+name)
		}
	}
	return given
}

func (o *Flags) credentialFlags() {
	o.text(&o.creds, "creds", "NATS_CREDS", "", "NATS credentials file (JWT and nkey seed)")
	o.text(&o.nkey, "nkey", "NATS_NKEY", "", "NATS nkey seed file")
	o.text(&o.user, "user", "NATS_USER", "", "NATS user")
	o.secret(&o.password, "password", "NATS_PASSWORD", "NATS `password` (with --user)")
	o.secret(&o.token, "token", "NATS_TOKEN", "NATS `token`")
}

// envText is the value of variable name, trimmed; blank is unset.
func envText(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// text registers a text flag whose default is variable env, else def; a URL flag shows its default
// redacted.
func (o *Flags) text(dst *string, name, env, def, usage string) {
	*dst = def
	if v := envText(env); v != "" {
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
func (o *Flags) secret(dst *string, name, env, usage string) {
	usage += " (env " + env + ")"
	if v := envText(env); v != "" {
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
	return RedactURL(*u.v)
}

func (u *urlValue) Set(v string) error { *u.v = v; return nil }

// source names where the value of flag name came from, for messages.
func (o *Flags) source(name string, fromContext bool, ctxPath string) string {
	switch {
	case flagprefix.Given(o.fs, name):
		return "--" + name
	case o.fromEnv[name] != "":
		return o.fromEnv[name] + " (default of --" + name + ")"
	case fromContext:
		return fmt.Sprintf("--context %s (%s)", o.context, ctxPath)
	}
	return "--" + name
}

// fieldFlags maps a ConnConfig field to the flag that sets it.
var fieldFlags = map[string]string{
	"URL": "server", "Creds": "creds", "NKey": "nkey", "User": "user", "Pass": "password",
	"TLSCA": "tls-ca", "TLSCert": "tls-cert", "TLSKey": "tls-key", "ConnectTimeout": "connect-timeout",
}

// Config resolves flags, variables and context into a checked ConnConfig; a bad value is an invalid.FlagError
// naming its flag, variable or context.
func (o *Flags) Config() (ConnConfig, error) {
	c := ConnConfig{Name: "fpmbus-" + o.name, ConnectTimeout: o.connectTimeout, Logger: slog.Default(),
		URL: o.url, Creds: o.creds, NKey: o.nkey, User: o.user, Pass: o.password, Token: o.token,
		TLSCA: o.tlsCA, TLSCert: o.tlsCert, TLSKey: o.tlsKey, TLSFirst: o.tlsFirst}
	if o.connectTimeout <= 0 {
		return c, invalid.Flagf("--connect-timeout %v: want a positive duration", o.connectTimeout)
	}
	fromContext := map[string]bool{}
	ctxPath := ""
	if o.context != "" {
		nctx, err := LoadNATSContext(o.context)
		if err != nil {
			return c, invalid.Flagf("%s: %v", o.source("context", false, ""), err)
		}
		ctxPath = nctx.Path
		given := func(name string) bool { return flagprefix.Given(o.fs, name) || o.fromEnv[name] != "" }
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
		if nctx.TLSFirst && !flagprefix.Given(o.fs, "tls-first") {
			c.TLSFirst = true
		}
	}
	if err := c.Validate(); err != nil {
		var ce *ConnConfigError
		if errors.As(err, &ce) {
			name := fieldFlags[ce.Field]
			return c, invalid.Flagf("%s: %v", o.source(name, fromContext[name], ctxPath), ce.Err)
		}
		return c, invalid.Flagf("%v", err)
	}
	return c, nil
}
