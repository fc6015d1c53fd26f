package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fpmbus/fpmbus/bridge"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/internal/upstack"
)

// `fpmbus up` refuses a bad setting before it starts anything, exit 2, naming the flag at fault.
func TestUpRefusesBadSettingsNamingThem(t *testing.T) {
	t.Setenv(envFPMPort, "") // unset: the default base port
	for name, tc := range map[string]struct {
		args    []string
		want    string
		notWant string
	}{
		"listen is not host:port":           {[]string{"--listen", "nope"}, `--listen "nope"`, ""},
		"dp-size overflows the port range":  {[]string{"--dp-size", "100000"}, "--dp-size 100000", envFPMPort},
		"max-bytes below -1":                {[]string{"--max-bytes", "-5"}, "-max-bytes", ""},
		"restart limit negative":            {[]string{"--restart-limit", "-1"}, "--restart-limit -1", ""},
		"restart window zero":               {[]string{"--restart-window", "0s"}, "--restart-window 0s", ""},
		"alias sets the prefixed flag":      {[]string{"--rank-timeout", "0s"}, "--merge-rank-timeout 0s", ""},
		"bool alias takes no value":         {[]string{"--allow-partial", "--listen", "nope"}, `--listen "nope"`, ""},
		"demo binds ports, not an endpoint": {[]string{"--demo", "--zmq-endpoint", "127.0.0.1:1"}, "--demo binds its own ports", ""},
		"gaps flag carries its prefix":      {[]string{"--gaps-pinned-ttl", "1ms"}, "--gaps-pinned-ttl 1ms", ""},
		"sync is always or a duration":      {[]string{"--sync", "often"}, `-sync: streams: bad sync policy: "often"`, ""},
		"sync interval must be positive":    {[]string{"--sync", "0s"}, "-sync", ""},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := run(t, append([]string{"up", "--data-dir", t.TempDir()}, tc.args...)...)
			if code != 2 || !strings.Contains(out, tc.want) || tc.notWant != "" && strings.Contains(out, tc.notWant) {
				t.Fatalf("exit %d, want 2 naming %q (and not %q):\n%s", code, tc.want, tc.notWant, out)
			}
		})
	}
}

// In `up` every consumer flag carries its component prefix, and the standalone name it had in `up`
// before stays as a deprecated alias unless an unprefixed flag owns it (the bridge's).
func TestUpFlagNamesFollowThePrefixRule(t *testing.T) {
	up := flag.NewFlagSet("up", flag.ContinueOnError)
	up.SetOutput(io.Discard)
	upFlags(up)
	bridgeOwn := flag.NewFlagSet("bridge", flag.ContinueOnError)
	(&bridge.Config{}).RegisterFlags(bridgeOwn, "")
	for prefix, register := range map[string]func(fs *flag.FlagSet){
		flagprefix.Trace: func(fs *flag.FlagSet) { traceFlags(fs, "") },
		flagprefix.Gaps:  func(fs *flag.FlagSet) { gapsFlags(fs, "") },
		flagprefix.Merge: func(fs *flag.FlagSet) { mergeFlags(fs, "") },
		flagprefix.Seal:  func(fs *flag.FlagSet) { sealFlags(fs, "") },
	} {
		standalone := flag.NewFlagSet(prefix, flag.ContinueOnError)
		register(standalone)
		standalone.VisitAll(func(f *flag.Flag) {
			name := prefix + strings.TrimPrefix(f.Name, prefix)
			if up.Lookup(name) == nil {
				t.Errorf("up has no --%s for the %s flag --%s", name, strings.TrimSuffix(prefix, "-"), f.Name)
			}
			if name == f.Name {
				return
			}
			old := up.Lookup(f.Name)
			if old == nil {
				t.Errorf("up has no --%s (deprecated alias or the bridge's)", f.Name)
				return
			}
			_, isAlias := old.Value.(*flagprefix.Alias)
			switch {
			case bridgeOwn.Lookup(f.Name) != nil && isAlias:
				t.Errorf("--%s is the bridge's in up, not an alias of --%s", f.Name, name)
			case bridgeOwn.Lookup(f.Name) == nil && !isAlias:
				t.Errorf("--%s is not a deprecated alias of --%s in up", f.Name, name)
			}
		})
	}
}

// planUp parses up's flags (with a data dir and trace output of the test's own), plans the run and, as
// runUp does once the data directory is owned, writes a missing token file, without starting anything.
func planUp(t *testing.T, args ...string) (*upstack.Run, error) {
	t.Helper()
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o := upFlags(fs)
	dir := t.TempDir()
	base := []string{"--data-dir", filepath.Join(dir, "data"), "--trace-output", filepath.Join(dir, "trace", "fpm")}
	if err := fs.Parse(append(base, args...)); err != nil {
		t.Fatal(err)
	}
	r, err := o.plan()
	if err != nil {
		return nil, err
	}
	return r, writeUpToken(r.Server)
}

// writeFile writes body to a new file in a fresh directory and returns its path.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The embedded server is secure by default: beyond loopback only with authentication (or --insecure),
// one source per setting, every bad value a usage error naming its flag; the components authenticate
// with the token of --auth-token-file or the credential flags.
func TestUpServerSecuritySettings(t *testing.T) {
	isolateNATSEnv(t)
	pki := natsservertest.NewPKI(t)
	users := "authorization { users: [ {user: admin, password: adminpw} ] }\n"
	for name, tc := range map[string]struct {
		args []string
		want []string // in the usage error; nil: the plan is accepted
		auth string   // the plan's description of how clients authenticate
	}{
		"loopback, no auth: as before":             {args: nil, auth: "none"},
		"beyond loopback without auth":             {args: []string{"--listen", "0.0.0.0:0"}, want: []string{"--listen 0.0.0.0:0", "--insecure", "--auth-token-file"}},
		"every interface, empty host":              {args: []string{"--listen", ":4222"}, want: []string{"--insecure"}},
		"--insecure lets it":                       {args: []string{"--listen", "0.0.0.0:0", "--insecure"}, auth: "none"},
		"beyond loopback with a token":             {args: []string{"--listen", "0.0.0.0:0", "--auth-token-file", "{tokenfile}"}, auth: "token from"},
		"config listening beyond loopback":         {args: []string{"--server-config", "{conf:listen: 0.0.0.0:4333}"}, want: []string{"--server-config", "listens on 0.0.0.0:4333", "--insecure"}},
		"config with users beyond loopback":        {args: []string{"--server-config", "{conf:listen: 0.0.0.0:4333\n" + users + "}", "--user", "admin", "--password", "adminpw"}, auth: "as configured in"},
		"config's no_auth_user is no auth":         {args: []string{"--server-config", "{conf:listen: 0.0.0.0:4333\naccounts { A { users: [ {user: a, password: b} ] } }\nno_auth_user: a}"}, want: []string{"--insecure"}},
		"--listen overrides the config's":          {args: []string{"--server-config", "{conf:listen: 0.0.0.0:4333}", "--listen", "127.0.0.1:0"}, auth: "as configured in"},
		"config file missing":                      {args: []string{"--server-config", "/nonexistent/nats.conf"}, want: []string{"--server-config", "/nonexistent/nats.conf"}},
		"token and a config with users":            {args: []string{"--server-config", "{conf:" + users + "}", "--auth-token-file", "{tokenfile}"}, want: []string{"--auth-token-file and --server-config"}},
		"token and --user":                         {args: []string{"--auth-token-file", "{tokenfile}", "--user", "x"}, want: []string{"--auth-token-file and --user"}},
		"empty token file":                         {args: []string{"--auth-token-file", "{emptyfile}"}, want: []string{"--auth-token-file", "empty"}},
		"token file is a symbolic link":            {args: []string{"--auth-token-file", "{linkfile}"}, want: []string{"--auth-token-file", "is a symbolic link to", "not a regular file"}},
		"token file is a named pipe":               {args: []string{"--auth-token-file", "{fifofile}"}, want: []string{"--auth-token-file", "is a named pipe", "not a regular file"}},
		"server certificate without key":           {args: []string{"--server-tls-cert", pki.ServerCert}, want: []string{"--server-tls-cert", "needs --server-tls-key"}},
		"client CA without certificate":            {args: []string{"--server-tls-ca", pki.CA}, want: []string{"--server-tls-ca"}},
		"certificate and the wrong key":            {args: []string{"--server-tls-cert", pki.ServerCert, "--server-tls-key", pki.ClientKey}, want: []string{"--server-tls-cert/--server-tls-key"}},
		"certificate over the config's TLS":        {args: []string{"--server-config", "{conf:tls { cert_file: \"" + pki.ServerCert + "\", key_file: \"" + pki.ServerKey + "\" }}", "--server-tls-cert", pki.ServerCert, "--server-tls-key", pki.ServerKey}, want: []string{"--server-tls-cert and --server-config"}},
		"TLS and a token":                          {args: []string{"--server-tls-cert", pki.ServerCert, "--server-tls-key", pki.ServerKey, "--auth-token-file", "{tokenfile}"}, auth: "token from"},
		"components' creds file missing":           {args: []string{"--creds", "/nonexistent/up.creds"}, want: []string{"--creds", "/nonexistent/up.creds"}},
		"mutual TLS authenticates beyond loopback": {args: []string{"--listen", "0.0.0.0:0", "--server-tls-cert", pki.ServerCert, "--server-tls-key", pki.ServerKey, "--server-tls-ca", pki.CA}, auth: "client certificates signed by"},
	} {
		t.Run(name, func(t *testing.T) {
			tokenFile := filepath.Join(t.TempDir(), "token")
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				switch {
				case a == "{tokenfile}":
					a = tokenFile
				case a == "{emptyfile}":
					a = writeFile(t, "empty", "\n")
				case a == "{linkfile}": // someone else's file as the server's secret
					a = filepath.Join(t.TempDir(), "token")
					if err := os.Symlink(writeFile(t, "secret", "not-a-token\n"), a); err != nil {
						t.Fatal(err)
					}
				case a == "{fifofile}": // a read that would never end
					a = filepath.Join(t.TempDir(), "token")
					if err := syscall.Mkfifo(a, 0o600); err != nil {
						t.Fatal(err)
					}
				case strings.HasPrefix(a, "{conf:"):
					a = writeFile(t, "nats.conf", strings.TrimSuffix(strings.TrimPrefix(a, "{conf:"), "}"))
				}
				args[i] = a
			}
			r, err := planUp(t, args...)
			if tc.want != nil {
				if !errors.Is(err, errUsage) {
					t.Fatalf("plan: %v, want a usage error", err)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("error %q does not say %q", err, w)
					}
				}
				if _, serr := os.Stat(tokenFile); serr == nil {
					t.Fatal("a refused plan wrote the token file")
				}
				return
			}
			if err != nil {
				t.Fatalf("plan: %v", err)
			}
			if !strings.HasPrefix(r.Server.Auth, tc.auth) {
				t.Fatalf("auth %q, want %q…", r.Server.Auth, tc.auth)
			}
			if strings.HasPrefix(tc.auth, "token from") {
				raw, err := os.ReadFile(tokenFile)
				st, serr := os.Stat(tokenFile)
				if err != nil || serr != nil || st.Mode().Perm() != 0o600 {
					t.Fatalf("token file: %v %v mode %v, want mode 0600", err, serr, st.Mode().Perm())
				}
				tok := strings.TrimSpace(string(raw))
				if len(tok) < 26 || r.Server.Config.AuthToken != tok || r.Server.Conn.Token != tok {
					t.Fatalf("token %q: server %q, components %q", tok, r.Server.Config.AuthToken, r.Server.Conn.Token)
				}
			}
		})
	}
}

// An existing token file is used as it is, never rewritten; the components present its token and
// nothing else, whatever credentials the variables hold for other servers.
func TestUpAuthTokenFileIsReused(t *testing.T) {
	isolateNATSEnv(t)
	t.Setenv("NATS_CREDS", "/nonexistent/other-server.creds")
	t.Setenv("NATS_USER", "someone")
	path := writeFile(t, "token", "my-own-token\n")
	r, err := planUp(t, "--auth-token-file", path)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if r.Server.Config.AuthToken != "my-own-token" || string(raw) != "my-own-token\n" {
		t.Fatalf("server token %q, file %q", r.Server.Config.AuthToken, raw)
	}
	if c := r.Server.Conn; c.Token != "my-own-token" || c.Creds != "" || c.User != "" {
		t.Fatalf("components' credentials %+v: want the token only", c)
	}
}
