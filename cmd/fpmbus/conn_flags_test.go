package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// parseConn registers the connection flags on a fresh FlagSet, parses args and resolves them.
func parseConn(t *testing.T, args ...string) (natsconn.ConnConfig, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := connFlags(fs, "test")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o.config()
}

// isolateNATSEnv unsets every variable the connection flags read and points the context directory at
// a fresh one, so the developer's environment cannot leak into a test.
func isolateNATSEnv(t *testing.T) string {
	t.Helper()
	for _, v := range []string{"NATS_URL", "NATS_CREDS", "NATS_NKEY", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CA", "NATS_CERT", "NATS_KEY", "NATS_CONTEXT"} {
		t.Setenv(v, "")
	}
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	return dir
}

// saveContext writes a nats CLI context where the nats CLI keeps it.
func saveContext(t *testing.T, configDir, name, body string) string {
	t.Helper()
	dir := filepath.Join(configDir, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A nats CLI context supplies every setting that neither a flag nor a variable gives; a variable
// overrides it, a flag overrides both.
func TestConnectionContextPrecedence(t *testing.T) {
	cfgDir := isolateNATSEnv(t)
	pki := natsservertest.NewPKI(t)
	saveContext(t, cfgDir, "lab", `{
  "url": "nats://ctx-host:4222",
  "user": "ctx-user",
  "password": "ctx-pass",
  "ca": "`+pki.CA+`",
  "cert": "`+pki.ClientCert+`",
  "key": "`+pki.ClientKey+`",
  "tls_first": true
}`)
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want natsconn.ConnConfig
	}{
		"context alone": {
			args: []string{"--context", "lab"},
			want: natsconn.ConnConfig{URL: "nats://ctx-host:4222", User: "ctx-user", Pass: "ctx-pass", TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey, TLSFirst: true},
		},
		"NATS_CONTEXT names it": {
			env:  map[string]string{"NATS_CONTEXT": "lab"},
			want: natsconn.ConnConfig{URL: "nats://ctx-host:4222", User: "ctx-user", Pass: "ctx-pass", TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey, TLSFirst: true},
		},
		"a variable overrides the context": {
			env:  map[string]string{"NATS_CONTEXT": "lab", "NATS_URL": "nats://env-host:4222", "NATS_USER": "env-user", "NATS_PASSWORD": "env-pass"},
			want: natsconn.ConnConfig{URL: "nats://env-host:4222", User: "env-user", Pass: "env-pass", TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey, TLSFirst: true},
		},
		"a flag overrides variable and context": {
			env:  map[string]string{"NATS_URL": "nats://env-host:4222"},
			args: []string{"--context", "lab", "--server", "nats://flag-host:4222", "--password", "flag-pass", "--tls-first=false"},
			want: natsconn.ConnConfig{URL: "nats://flag-host:4222", User: "ctx-user", Pass: "flag-pass", TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey},
		},
		"no context": {
			args: []string{"--user", "u"},
			want: natsconn.ConnConfig{URL: "nats://127.0.0.1:4222", User: "u"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got, err := parseConn(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			got.Name, got.Logger, got.ConnectTimeout = "", nil, 0
			if got != tc.want {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Every bad connection setting exits 2 before any connection attempt, naming the flag, the variable or
// the context it came from.
func TestConnectionFlagsBadValuesExit2(t *testing.T) {
	cfgDir := isolateNATSEnv(t)
	pki := natsservertest.NewPKI(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	ctxPath := saveContext(t, cfgDir, "broken", `{"url": "nats://h:4222", "creds": "`+missing+`"}`)
	saveContext(t, cfgDir, "domain", `{"url": "nats://h:4222", "jetstream_domain": "hub"}`)
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want []string
	}{
		"creds file missing":        {args: []string{"--creds", missing}, want: []string{"--creds", "missing.pem"}},
		"creds file from variable":  {env: map[string]string{"NATS_CREDS": missing}, want: []string{"NATS_CREDS", "--creds"}},
		"nkey seed not a seed":      {args: []string{"--nkey", pki.CA}, want: []string{"--nkey"}},
		"CA missing":                {args: []string{"--tls-ca", missing}, want: []string{"--tls-ca", "missing.pem"}},
		"CA from variable, missing": {env: map[string]string{"NATS_CA": missing}, want: []string{"NATS_CA"}},
		"certificate without key":   {args: []string{"--tls-cert", pki.ClientCert}, want: []string{"--tls-key", "needs its key"}},
		"key without certificate":   {args: []string{"--tls-key", pki.ClientKey}, want: []string{"--tls-cert"}},
		"password without user":     {env: map[string]string{"NATS_PASSWORD": "pw"}, want: []string{"NATS_PASSWORD", "no user"}},
		"bad URL":                   {args: []string{"--server", "nats://u:hidden@host:99999"}, want: []string{"--server", "REDACTED"}},
		"connect timeout zero":      {args: []string{"--connect-timeout", "0s"}, want: []string{"--connect-timeout"}},
		"context missing":           {args: []string{"--context", "nope"}, want: []string{"--context", "nope.json"}},
		"context from variable":     {env: map[string]string{"NATS_CONTEXT": "nope"}, want: []string{"NATS_CONTEXT"}},
		"context's creds missing":   {args: []string{"--context", "broken"}, want: []string{"--context broken", ctxPath, "missing.pem"}},
		"context sets a JS domain":  {args: []string{"--context", "domain"}, want: []string{"--context", "jetstream_domain"}},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			for _, cmd := range [][]string{{"streams", "apply"}, {"bridge"}} {
				begin := time.Now()
				code, out := run(t, append(cmd, tc.args...)...)
				if code != 2 {
					t.Fatalf("%s: exit %d, want 2:\n%s", cmd, code, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Fatalf("%s: output does not name %q:\n%s", cmd, w, out)
					}
				}
				if strings.Contains(out, "hidden") {
					t.Fatalf("%s: output shows the URL's password:\n%s", cmd, out)
				}
				if took := time.Since(begin); took > 5*time.Second {
					t.Fatalf("%s: took %v: a bad setting is refused before connecting", cmd, took)
				}
			}
		})
	}
}

// No help text, usage error or refused value shows a secret given by a variable: -h and a usage error
// of every command, and of `up`, with NATS_PASSWORD, NATS_TOKEN and a password in NATS_URL set.
func TestSecretsNeverShownInHelpOrUsageErrors(t *testing.T) {
	isolateNATSEnv(t)
	const pw, tok, urlPW = "pw-SECRET-1", "tok-SECRET-2", "url-SECRET-3"
	t.Setenv("NATS_USER", "bridge")
	t.Setenv("NATS_PASSWORD", pw)
	t.Setenv("NATS_TOKEN", tok)
	t.Setenv("NATS_URL", "nats://bridge:"+urlPW+"@127.0.0.1:1")
	for _, path := range documentedCommands {
		for _, extra := range [][]string{{"-h"}, {"--no-such-flag"}} {
			args := append(strings.Fields(path), extra...)
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				_, out := run(t, args...)
				for _, secret := range []string{pw, tok, urlPW} {
					if strings.Contains(out, secret) {
						t.Fatalf("output shows a secret:\n%s", out)
					}
				}
				if extra[0] == "-h" && strings.Contains(out, "-password") && !strings.Contains(out, "(default: set from NATS_PASSWORD)") {
					t.Fatalf("-h does not say that --password is set from NATS_PASSWORD:\n%s", out)
				}
			})
		}
	}
}
