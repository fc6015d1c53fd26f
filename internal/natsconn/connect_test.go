package natsconn_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// quiet drops the connection events a test does not look at.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const (
	testUser     = "bridge"
	testPassword = "s3cr3t-pw"
	testToken    = "s3cr3t-token"
)

// startConfigured runs an embedded server from a nats-server configuration file with the given body.
func startConfigured(t *testing.T, conf string, mutate func(*natsserver.ServerConfig)) *natsserver.Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	base, err := natsserver.LoadServerConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Base: base}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := natsserver.StartServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return srv
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// dialCounter is a TCP relay in front of a server that counts the connections made through it: the
// attempts of a client connecting through it.
type dialCounter struct {
	ln    net.Listener
	dials atomic.Int64
}

func newDialCounter(t *testing.T, upstream string) *dialCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dialCounter{ln: ln}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.dials.Add(1)
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			for _, pair := range [][2]net.Conn{{c, u}, {u, c}} {
				go func() {
					defer wg.Done()
					_, _ = io.Copy(pair[1], pair[0])
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return d
}

// Every failure of the first connection names its real cause, with errors.Is on its kind and on the
// cause; the server's refusals (credentials, TLS) are not retried (the client connects once, counted
// by a relay in front of the server), an unreachable server is retried until the connect timeout. No
// error holds a secret.
func TestConnectNamesTheCauseOfAFailedFirstConnection(t *testing.T) {
	pki := natsservertest.NewPKI(t)
	tlsUsers := startConfigured(t, fmt.Sprintf(`
authorization { users: [ {user: %s, password: %s} ] }
tls { cert_file: %q, key_file: %q }
`, testUser, testPassword, pki.ServerCert, pki.ServerKey), nil)
	token := startConfigured(t, "authorization { token: "+testToken+" }\n", nil)
	mutual := startConfigured(t, fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }\n",
		pki.ServerCert, pki.ServerKey, pki.CA), nil)
	refused := fmt.Sprintf("nats://127.0.0.1:%d", closedPort(t))

	const timeout = 1500 * time.Millisecond
	for name, tc := range map[string]struct {
		cfg      natsconn.ConnConfig
		kind     error // nil: connects
		cause    error
		causeAs  any
		fast     bool // refused at once, without waiting for the timeout
		inDetail string
	}{
		"right user, password and CA": {cfg: natsconn.ConnConfig{URL: tlsUsers.ClientURL(), User: testUser, Pass: testPassword, TLSCA: pki.CA}},
		"wrong password": {cfg: natsconn.ConnConfig{URL: tlsUsers.ClientURL(), User: testUser, Pass: "wrong", TLSCA: pki.CA},
			kind: natsconn.ErrAuth, cause: nats.ErrAuthorization, fast: true, inDetail: `user "bridge" with a password`},
		"password in the URL, wrong": {cfg: natsconn.ConnConfig{URL: strings.Replace(tlsUsers.ClientURL(), "://", "://bridge:wrong-in-url@", 1), TLSCA: pki.CA},
			kind: natsconn.ErrAuth, cause: nats.ErrAuthorization, fast: true, inDetail: "user info in the server URL"},
		"no credentials": {cfg: natsconn.ConnConfig{URL: tlsUsers.ClientURL(), TLSCA: pki.CA},
			kind: natsconn.ErrAuth, cause: nats.ErrAuthorization, fast: true, inDetail: "no credentials"},
		"missing CA": {cfg: natsconn.ConnConfig{URL: tlsUsers.ClientURL(), User: testUser, Pass: testPassword},
			kind: natsconn.ErrTLS, causeAs: new(x509.UnknownAuthorityError), fast: true, inDetail: "no CA was given"},
		"the wrong CA": {cfg: natsconn.ConnConfig{URL: tlsUsers.ClientURL(), User: testUser, Pass: testPassword, TLSCA: pki.OtherCA},
			kind: natsconn.ErrTLS, causeAs: new(x509.UnknownAuthorityError), fast: true, inDetail: "not signed by the CA"},
		"right token": {cfg: natsconn.ConnConfig{URL: token.ClientURL(), Token: testToken}},
		"wrong token": {cfg: natsconn.ConnConfig{URL: token.ClientURL(), Token: "wrong"}, kind: natsconn.ErrAuth, cause: nats.ErrAuthorization, fast: true, inDetail: "a token"},
		"mutual TLS":  {cfg: natsconn.ConnConfig{URL: mutual.ClientURL(), TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey}},
		"no client certificate": {cfg: natsconn.ConnConfig{URL: mutual.ClientURL(), TLSCA: pki.CA},
			kind: natsconn.ErrTLS, fast: true, inDetail: "none was given"},
		"connection refused": {cfg: natsconn.ConnConfig{URL: refused}, kind: natsconn.ErrUnreachable, cause: syscall.ECONNREFUSED, inDetail: "no answer within"},
		"DNS failure": {cfg: natsconn.ConnConfig{URL: "nats://no-such-host.invalid:4222"},
			kind: natsconn.ErrUnreachable, causeAs: new(*net.DNSError), inDetail: "no answer within"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.ConnectTimeout, cfg.Logger = timeout, quiet
			var relay *dialCounter
			if tc.fast {
				u, err := url.Parse(cfg.URL)
				if err != nil {
					t.Fatal(err)
				}
				relay = newDialCounter(t, u.Host)
				cfg.URL = strings.Replace(cfg.URL, u.Host, relay.ln.Addr().String(), 1)
			}
			begin := time.Now()
			nc, err := natsconn.Connect(cfg)
			took := time.Since(begin)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				nc.Close()
				return
			}
			if err == nil {
				nc.Close()
				t.Fatalf("connected, want %v", tc.kind)
			}
			var ce *natsconn.ConnectError
			if !errors.As(err, &ce) || !errors.Is(err, tc.kind) {
				t.Fatalf("error %q (%T), want a ConnectError of kind %v", err, err, tc.kind)
			}
			if tc.cause != nil && !errors.Is(err, tc.cause) {
				t.Fatalf("error %q does not wrap %v", err, tc.cause)
			}
			if tc.causeAs != nil && !errorsAs(err, tc.causeAs) {
				t.Fatalf("error %q does not wrap a %T", err, tc.causeAs)
			}
			if !strings.Contains(ce.Detail, tc.inDetail) {
				t.Fatalf("detail %q does not say %q", ce.Detail, tc.inDetail)
			}
			// One connection; two when the server ended the attempt without a word and its INFO, read on
			// a connection of its own, named the required client certificate.
			dials := int64(1)
			if strings.Contains(ce.Detail, "its INFO says tls_verify") {
				dials = 2
			}
			switch {
			case tc.fast && relay.dials.Load() != dials:
				t.Fatalf("connected %d times, want %d: a refusal is not retried", relay.dials.Load(), dials)
			case !tc.fast && took < timeout:
				t.Fatalf("gave up after %v, before the %v timeout", took, timeout)
			case took > timeout+6*time.Second:
				t.Fatalf("took %v, far beyond the %v timeout", took, timeout)
			}
			for _, secret := range []string{testPassword, testToken, "wrong-in-url"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error %q holds a secret", err)
				}
			}
		})
	}
}

// errorsAs is errors.As with a target made by new(T).
func errorsAs(err error, target any) bool { return errors.As(err, target) }

// A server that comes up while the client waits is connected to: the first connection waits for it
// (within the timeout) instead of failing, and without leaving a connection that never connected.
func TestConnectWaitsForAServerThatComesUp(t *testing.T) {
	port := closedPort(t)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := natsconn.Connect(natsconn.ConnConfig{URL: "nats://" + listen, ConnectTimeout: 20 * time.Second, Logger: quiet})
		done <- result{nc, err}
	}()
	time.Sleep(700 * time.Millisecond)
	natsservertest.StartAt(t, listen, t.TempDir())
	r := <-done
	if r.err != nil {
		t.Fatalf("connect: %v", r.err)
	}
	defer r.nc.Close()
	if _, err := r.nc.JetStream(); err != nil {
		t.Fatal(err)
	}
	if err := r.nc.Publish("x", nil); err != nil || r.nc.Flush() != nil {
		t.Fatalf("publish on the connection: %v", err)
	}
}

// The server stops accepting the credentials of a running client (its password changed and it was
// restarted): the client is refused twice, its connection closes for good, and OnClosed hands the
// cause, an authorization violation, to whoever must stop.
func TestOnClosedReportsAuthorizationLostLater(t *testing.T) {
	dir, store := t.TempDir(), t.TempDir()
	listen := fmt.Sprintf("127.0.0.1:%d", closedPort(t))
	start := func(password string) *natsserver.Server {
		path := filepath.Join(dir, "server.conf")
		conf := fmt.Sprintf("authorization { users: [ {user: %s, password: %s} ] }\n", testUser, password)
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		base, err := natsserver.LoadServerConfig(path)
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
	srv := start(testPassword)
	nc, err := natsconn.Connect(natsconn.ConnConfig{URL: srv.ClientURL(), User: testUser, Pass: testPassword, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	causes := make(chan error, 2)
	natsconn.OnClosed(nc, func(cause error) { causes <- cause })
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	start("rotated")
	select {
	case cause := <-causes:
		if !errors.Is(cause, nats.ErrAuthorization) {
			t.Fatalf("closed with %v, want an authorization violation", cause)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the connection was not closed after the server refused the credentials")
	}
	// OnClosed on a closed connection reports at once, and only once per registration.
	again := make(chan error, 2)
	natsconn.OnClosed(nc, func(cause error) { again <- cause })
	if cause := <-again; !errors.Is(cause, nats.ErrAuthorization) {
		t.Fatalf("late OnClosed: %v", cause)
	}
	if len(causes) != 0 || len(again) != 0 {
		t.Fatal("OnClosed called f more than once")
	}
}

// lockedBuffer collects log output written from nats.go's callback goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A subject the user's permissions do not allow: the server refuses it and the connection logs an
// error naming the refused subject and who the client is (never the password); what is allowed is not
// logged.
func TestConnectLogsTheSubjectTheServerRefuses(t *testing.T) {
	srv := startConfigured(t, fmt.Sprintf(`authorization { users: [ {user: %s, password: %s,
  permissions: { publish: { allow: ["allowed.>"] }, subscribe: { allow: ["_INBOX.>"] } } } ] }`, testUser, testPassword), nil)
	var out lockedBuffer
	nc, err := natsconn.Connect(natsconn.ConnConfig{URL: srv.ClientURL(), User: testUser, Pass: testPassword,
		Logger: slog.New(slog.NewJSONHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, subj := range []string{"allowed.x", "refused.x"} {
		if err := nc.Publish(subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Level       string `json:"level"`
		Error       string `json:"error"`
		Credentials string `json:"credentials"`
	}
	for deadline := time.Now().Add(10 * time.Second); rec.Level == ""; time.Sleep(10 * time.Millisecond) {
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if line != "" && json.Unmarshal([]byte(line), &rec) != nil {
				t.Fatalf("log line %q is not JSON", line)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing logged for the refused publish")
		}
	}
	if rec.Level != "ERROR" || !strings.Contains(rec.Error, `Permissions Violation for Publish to "refused.x"`) ||
		!strings.Contains(rec.Credentials, `user "bridge"`) {
		t.Fatalf("logged %+v: want an error naming the refused subject and the user", rec)
	}
	if s := out.String(); strings.Contains(s, "allowed.x") || strings.Contains(s, testPassword) {
		t.Fatalf("the log names the allowed subject or shows the password:\n%s", s)
	}
}

// Validate refuses, naming the field, what no server needs to see to be wrong; Connect returns that
// error without dialing.
func TestConnConfigValidateNamesTheField(t *testing.T) {
	pki := natsservertest.NewPKI(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := "nats://127.0.0.1:4222"
	for name, tc := range map[string]struct {
		cfg   natsconn.ConnConfig
		field string
	}{
		"creds file missing":           {natsconn.ConnConfig{URL: url, Creds: missing}, "Creds"},
		"creds file not creds":         {natsconn.ConnConfig{URL: url, Creds: garbage}, "Creds"},
		"nkey seed missing":            {natsconn.ConnConfig{URL: url, NKey: missing}, "NKey"},
		"nkey seed not a seed":         {natsconn.ConnConfig{URL: url, NKey: garbage}, "NKey"},
		"CA missing":                   {natsconn.ConnConfig{URL: url, TLSCA: missing}, "TLSCA"},
		"CA not PEM":                   {natsconn.ConnConfig{URL: url, TLSCA: garbage}, "TLSCA"},
		"certificate without key":      {natsconn.ConnConfig{URL: url, TLSCert: pki.ClientCert}, "TLSKey"},
		"key without certificate":      {natsconn.ConnConfig{URL: url, TLSKey: pki.ClientKey}, "TLSCert"},
		"certificate with wrong key":   {natsconn.ConnConfig{URL: url, TLSCert: pki.ClientCert, TLSKey: pki.ServerKey}, "TLSCert"},
		"password without user":        {natsconn.ConnConfig{URL: url, Pass: "pw"}, "Pass"},
		"URL with a bad port":          {natsconn.ConnConfig{URL: "nats://u:pw-in-url@host:99999"}, "URL"},
		"URL with a bad scheme":        {natsconn.ConnConfig{URL: "http://host:4222"}, "URL"},
		"empty URL":                    {natsconn.ConnConfig{URL: " "}, "URL"},
		"URL missing the scheme's ':'": {natsconn.ConnConfig{URL: "nats//127.0.0.1:4222"}, "URL"},
		"URL with a path":              {natsconn.ConnConfig{URL: "nats://u:pw-in-url@host:4222/x"}, "URL"},
		"second URL with a query":      {natsconn.ConnConfig{URL: url + ",tls://host:4222?x=1"}, "URL"},
		"negative connect timeout":     {natsconn.ConnConfig{URL: url, ConnectTimeout: -time.Second}, "ConnectTimeout"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := natsconn.Connect(tc.cfg)
			var ce *natsconn.ConnConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, natsconn.ErrInvalidConnConfig) {
				t.Fatalf("error %v, want a ConnConfigError on %s", err, tc.field)
			}
			if strings.Contains(err.Error(), "pw-in-url") {
				t.Fatalf("error %q holds the URL's password", err)
			}
		})
	}
	valid := natsconn.ConnConfig{URL: "nats://a:4222, tls://b:4443,c:4222", TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey}
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
}

// The token and TLS settings of ServerConfig make a server that only a client with the token and the
// CA reaches; an in-process client (what `fpmbus up` runs its components on) skips TLS and still
// needs the token.
func TestServerTokenAndTLS(t *testing.T) {
	pki := natsservertest.NewPKI(t)
	srv, err := natsserver.StartServer(natsserver.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir(),
		AuthToken: testToken, TLSCert: pki.ServerCert, TLSKey: pki.ServerKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	if !strings.HasPrefix(srv.ClientURL(), "tls://") {
		t.Fatalf("client URL %s of a TLS server", srv.ClientURL())
	}
	connect := func(c natsconn.ConnConfig) error {
		c.ConnectTimeout, c.Logger = 2*time.Second, quiet
		nc, err := natsconn.Connect(c)
		if err == nil {
			nc.Close()
		}
		return err
	}
	for name, tc := range map[string]struct {
		cfg  natsconn.ConnConfig
		want error
	}{
		"token and CA":           {natsconn.ConnConfig{URL: srv.ClientURL(), Token: testToken, TLSCA: pki.CA}, nil},
		"no token":               {natsconn.ConnConfig{URL: srv.ClientURL(), TLSCA: pki.CA}, nats.ErrAuthorization},
		"no CA":                  {natsconn.ConnConfig{URL: srv.ClientURL(), Token: testToken}, natsconn.ErrTLS},
		"in-process, token":      {natsconn.ConnConfig{InProcess: srv, Token: testToken}, nil},
		"in-process, no token":   {natsconn.ConnConfig{InProcess: srv}, nats.ErrAuthorization},
		"in-process, a CA given": {natsconn.ConnConfig{InProcess: srv, Token: testToken, TLSCA: pki.CA}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			err := connect(tc.cfg)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("connect: %v, want %v", err, tc.want)
			}
		})
	}
}

// A server that requires a client certificate can end the connection of a client without one before
// its refusal reaches the client (under load, the TLS alert is lost behind a reset). The server's INFO
// already said it requires one: the failure is a TLS error, named at once, not an unreachable server
// retried until the timeout. The server here says so and closes without a word, every time.
func TestConnectNamesARequiredClientCertificateWhenTheServerClosesWithoutAWord(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Write([]byte(`INFO {"server_id":"x","version":"2.12.0","proto":1,"max_payload":1048576,"tls_required":true,"tls_verify":true}` + "\r\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })

	pki := natsservertest.NewPKI(t)
	_, err = natsconn.Connect(natsconn.ConnConfig{URL: "nats://" + ln.Addr().String(), TLSCA: pki.CA,
		ConnectTimeout: 3 * time.Second, Logger: quiet})
	if !errors.Is(err, natsconn.ErrTLS) {
		t.Fatalf("error %v, want %v", err, natsconn.ErrTLS)
	}
	var ce *natsconn.ConnectError
	if !errors.As(err, &ce) || !strings.Contains(ce.Detail, "requires a client certificate") {
		t.Fatalf("error %v does not say the server requires a client certificate", err)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("connected %d times, want 2 (the attempt, and the read of its INFO): a refusal is not retried", n)
	}
}
