package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/producer/producertest"
	"github.com/fpmbus/fpmbus/streams"
)

// Security through the real binary: the embedded server of `fpmbus up` with authentication and TLS,
// clients that fail to reach it naming the cause, secrets that never reach the output, and a component
// that stops when the server stops accepting its credentials.

// connectTimeout is the --connect-timeout of the clients below: short, so that a test of "gives up
// within the timeout" is quick.
const connectTimeout = 2 * time.Second

// runResult is one finished fpmbus run.
type runResult struct {
	out  string
	code int
	took time.Duration
}

// runFpmbus runs fpmbus to completion with extra environment variables.
func runFpmbus(t *testing.T, env []string, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fpmbusBin, args...)
	cmd.Env = append(testEnv(t), env...)
	begin := time.Now()
	out, err := cmd.CombinedOutput()
	r := runResult{out: string(out), took: time.Since(begin)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("fpmbus %v: %v", args, err)
	}
	return r
}

// startFpmbus starts fpmbus with extra environment variables; it is killed at cleanup if still running.
func startFpmbus(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, env, fpmbusBin, args...)
}

// writeTemp writes body to name in a fresh temporary directory.
func writeTemp(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// wantFailure checks a client run that must fail: exit status code, every string of want on its
// output, within the connect timeout (plus process start and the last attempt).
func wantFailure(t *testing.T, r runResult, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d:\n%s", r.code, code, r.out)
	}
	for _, w := range want {
		if !strings.Contains(r.out, w) {
			t.Fatalf("output does not say %q:\n%s", w, r.out)
		}
	}
	if r.took > connectTimeout+10*time.Second {
		t.Fatalf("took %v, the connect timeout is %v", r.took, connectTimeout)
	}
}

// `fpmbus up --server-config` runs the embedded server from a nats-server configuration with users and
// TLS; the components connect in-process as the configured admin and the pipeline runs. A client that
// cannot connect exits nonzero within --connect-timeout naming the cause: a wrong password, a missing
// CA, a host that does not resolve, a port nobody listens on; a missing CA file is a usage error.
func TestUpServerConfigClientsNameWhyTheyCannotConnect(t *testing.T) {
	t.Parallel()
	const adminPW, readerPW = "admin-Secret-1", "reader-Secret-2"
	pki := natsservertest.NewPKI(t)
	conf := writeTemp(t, "nats.conf", fmt.Sprintf(`
accounts {
  FPMBUS: { jetstream: enabled, users: [ {user: admin, password: %s}, {user: reader, password: %s} ] }
}
tls { cert_file: %q, key_file: %q }
`, adminPW, readerPW, pki.ServerCert, pki.ServerKey))
	up := startUp(t, 1, "--server-config", conf, "--user", "admin", "--password", adminPW)

	// The pipeline runs with authentication: FPMs published now reach the stream.
	if err := publish(t, 1, up.basePort, 1, 50, "authed", "--rate", "500").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	nc, err := nats.Connect(up.url, nats.UserInfo("admin", adminPW), nats.RootCAs(pki.CA))
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	waitStreamCount(t, js, streams.StreamFPM, 50, 30*time.Second)

	timeout := "--connect-timeout=" + connectTimeout.String()
	apply := []string{"streams", "apply", "--dry-run", timeout}
	missingCA := filepath.Join(t.TempDir(), "missing-ca.pem")
	closedPort := freePort(t)
	for name, tc := range map[string]struct {
		env  []string
		args []string
		code int
		want []string
	}{
		"right password and CA": {env: []string{"NATS_USER=reader", "NATS_PASSWORD=" + readerPW, "NATS_CA=" + pki.CA},
			args: []string{"--server", up.url}, want: []string{"dry run: nothing changed"}},
		"wrong password": {env: []string{"NATS_USER=reader", "NATS_PASSWORD=wrong-pw", "NATS_CA=" + pki.CA},
			args: []string{"--server", up.url}, code: 1, want: []string{"refused the credentials", `user "reader" with a password`, "Authorization Violation", "--user/--password"}},
		"missing TLS CA": {env: []string{"NATS_USER=reader", "NATS_PASSWORD=" + readerPW},
			args: []string{"--server", up.url}, code: 1, want: []string{"TLS handshake", "certificate signed by unknown authority", "no CA was given", "--tls-ca"}},
		"CA file missing": {env: []string{"NATS_USER=reader", "NATS_PASSWORD=" + readerPW},
			args: []string{"--server", up.url, "--tls-ca", missingCA}, code: 2, want: []string{"--tls-ca", missingCA}},
		"bad URL (DNS)": {args: []string{"--server", "nats://no-such-host.invalid:4222"},
			code: 1, want: []string{"not reachable", "no such host", "--server"}},
		"refused port": {args: []string{"--server", "nats://127.0.0.1:" + strconv.Itoa(closedPort)},
			code: 1, want: []string{"not reachable", "connection refused"}},
	} {
		t.Run(name, func(t *testing.T) {
			r := runFpmbus(t, tc.env, append(apply, tc.args...)...)
			wantFailure(t, r, tc.code, tc.want...)
			if tc.code == 1 && strings.Contains(tc.want[0], "not reachable") && r.took < connectTimeout {
				t.Fatalf("gave up after %v, before --connect-timeout %v", r.took, connectTimeout)
			}
			for _, secret := range []string{adminPW, readerPW} {
				if strings.Contains(r.out, secret) {
					t.Fatalf("output shows a password:\n%s", r.out)
				}
			}
		})
	}
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	if strings.Contains(up.proc.Output(), adminPW) {
		t.Fatalf("fpmbus up printed the components' password:\n%s", up.proc.Output())
	}
}

// `fpmbus up --auth-token-file` creates a missing token file (mode 0600, a random token) and every
// client, its own components included, must present it: with the token the pipeline stores FPMs, a
// wrong or missing one is an authorization violation.
func TestUpAuthTokenFile(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	up := startUp(t, 1, "--auth-token-file", tokenFile)
	st, err := os.Stat(tokenFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, mode %v; want mode 0600", err, st.Mode().Perm())
	}
	raw, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(raw))
	if len(token) < 26 {
		t.Fatalf("token %q is too short to be random", token)
	}
	if err := publish(t, 1, up.basePort, 1, 40, "tokened", "--rate", "500").wait(30 * time.Second); err != nil {
		t.Fatalf("publisher: %v", err)
	}
	nc, err := nats.Connect(up.url, nats.Token(token))
	if err != nil {
		t.Fatalf("client with the token: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	waitStreamCount(t, js, streams.StreamFPM, 40, 30*time.Second)

	apply := []string{"streams", "apply", "--dry-run", "--server", up.url, "--connect-timeout=" + connectTimeout.String()}
	if r := runFpmbus(t, []string{"NATS_TOKEN=" + token}, apply...); r.code != 0 {
		t.Fatalf("with the token: exit %d\n%s", r.code, r.out)
	}
	wantFailure(t, runFpmbus(t, []string{"NATS_TOKEN=wrong-token"}, apply...), 1, "Authorization Violation", "presented: a token", "--token")
	wantFailure(t, runFpmbus(t, nil, apply...), 1, "Authorization Violation", "presented: no credentials")
	if err := up.proc.signal(syscall.SIGTERM, 60*time.Second); err != nil {
		t.Fatalf("fpmbus up exit: %v", err)
	}
	if strings.Contains(up.proc.Output(), token) {
		t.Fatalf("fpmbus up printed its token:\n%s", up.proc.Output())
	}
}

// Beyond loopback without authentication `fpmbus up` refuses to start, exit 2, naming --insecure, and
// binds nothing.
func TestUpRefusesToListenBeyondLoopbackWithoutAuth(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"--listen":        {"--listen", fmt.Sprintf("0.0.0.0:%d", port)},
		"--server-config": {"--server-config", writeTemp(t, "nats.conf", fmt.Sprintf("listen: 0.0.0.0:%d\n", port))},
	} {
		t.Run(name, func(t *testing.T) {
			r := runFpmbus(t, nil, append([]string{"up", "--data-dir", filepath.Join(dir, "data"), "--trace-output", filepath.Join(dir, "t", "fpm")}, args...)...)
			wantFailure(t, r, 2, "--insecure", "needs authentication")
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
				c.Close()
				t.Fatal("something listens on the port fpmbus up refused")
			}
		})
	}
}

// No secret given through NATS_PASSWORD, NATS_TOKEN or a password in NATS_URL appears in -h, in a
// usage error, or in the logs (at debug level) of a run that works and of one the server refuses.
func TestSecretsNeverReachTheOutput(t *testing.T) {
	t.Parallel()
	const pw, tok, wrongPW = "pw-Secret-7", "tok-Secret-8", "wrong-Secret-9"
	conf := writeTemp(t, "nats.conf", "authorization { users: [ {user: bridge, password: "+pw+"} ] }\n")
	base, err := natsserver.LoadServerConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Base: base})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	hostPort := strings.TrimPrefix(srv.ClientURL(), "nats://")
	secretEnv := func(password string) []string {
		return []string{"FPMBUS_LOG_LEVEL=debug", "NATS_USER=bridge", "NATS_PASSWORD=" + password, "NATS_TOKEN=" + tok,
			"NATS_URL=nats://bridge:" + password + "@" + hostPort}
	}
	noSecrets := func(t *testing.T, what, out string) {
		t.Helper()
		for _, s := range []string{pw, tok, wrongPW} {
			if strings.Contains(out, s) {
				t.Fatalf("%s shows a secret:\n%s", what, out)
			}
		}
	}
	for _, args := range [][]string{{"bridge", "-h"}, {"trace", "-h"}, {"up", "-h"}, {"bridge", "--no-such-flag"}, {"gaps", "--stale-after", "x"}, {"up", "--no-such-flag"}} {
		r := runFpmbus(t, secretEnv(pw), args...)
		noSecrets(t, strings.Join(args, " "), r.out)
		if args[1] == "-h" && !strings.Contains(r.out, "(default: set from NATS_PASSWORD)") {
			t.Fatalf("%v does not say the password is set from NATS_PASSWORD:\n%s", args, r.out)
		}
	}

	// A run that works: the bridge connects, is ready, stops on SIGTERM.
	basePort := producertest.FreeBasePort(t, "", 1)
	b := startFpmbus(t, "bridge", secretEnv(pw), "bridge", "--fpm-port", strconv.Itoa(basePort), "--dp-size", "1")
	b.waitOutput("bridge ready", 30*time.Second)
	if err := b.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("bridge exit: %v", err)
	}
	noSecrets(t, "the bridge's log", b.Output())
	if !strings.Contains(b.Output(), "bridge:"+natsconn.Redacted+"@") {
		t.Fatalf("the bridge's log does not show the server URL redacted:\n%s", b.Output())
	}

	// A run the server refuses.
	r := runFpmbus(t, secretEnv(wrongPW), "bridge", "--fpm-port", strconv.Itoa(basePort), "--dp-size", "1", "--connect-timeout", "5s")
	wantFailure(t, r, 1, "Authorization Violation")
	noSecrets(t, "the refused bridge's log", r.out)
}

// A running bridge whose credentials the server stops accepting (the password was rotated and the
// server restarted) logs that the server refused them and exits 1 naming the cause, instead of
// publishing forever on a connection that cannot come back.
func TestBridgeStopsWhenTheServerRefusesItsCredentialsLater(t *testing.T) {
	t.Parallel()
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	store := t.TempDir()
	startServer := func(password string) *natsserver.Server {
		conf := writeTemp(t, "nats.conf", "authorization { users: [ {user: bridge, password: "+password+"} ] }\n")
		base, err := natsserver.LoadServerConfig(conf)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: listen, StoreDir: store, Base: base})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
		return srv
	}
	srv := startServer("before-rotation")
	basePort := producertest.FreeBasePort(t, "", 1)
	b := startFpmbus(t, "bridge", []string{"NATS_USER=bridge", "NATS_PASSWORD=before-rotation"},
		"bridge", "--server", "nats://"+listen, "--fpm-port", strconv.Itoa(basePort), "--dp-size", "1")
	b.waitOutput("bridge ready", 30*time.Second)
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	startServer("after-rotation")
	err := b.wait(60 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("bridge ended with %v, want exit status 1:\n%s", err, b.Output())
	}
	for _, want := range []string{"refused this client's credentials", "closed for good", "Authorization Violation"} {
		if !strings.Contains(b.Output(), want) {
			t.Fatalf("the bridge's output does not say %q:\n%s", want, b.Output())
		}
	}
}
