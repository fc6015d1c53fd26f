package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// The shipped server configurations (ops/nats) prepared for a test: copied to a temporary directory as
// they are, except for what only a deployment can know — the include of permissions.conf is enabled,
// every placeholder password is replaced by a random one, and the host's ports and data directories
// become free loopback ports and the test's directories. Every rewrite must find its text exactly once,
// so a configuration edited out from under the test fails here, naming the line, instead of silently
// testing something else.

// opsDir is ops/nats seen from the e2e package.
const opsDir = "../ops/nats"

// opsRoles are the users of permissions.conf, each with the placeholder password the file ships with.
var opsRoles = []string{"bridge", "trace", "gaps", "merge", "seal", "predict", "reader", "operator", "sys"}

// placeholderRe matches one user's password line in permissions.conf.
var placeholderRe = regexp.MustCompile(`user: (\w+), +password: "([^"]*)"`)

// opsPermissions copies permissions.conf into dir with each placeholder replaced by a random password
// and returns user → password. Every user of the file must carry the placeholder "change-me-<user>"
// (the file never ships a password), and the users must be exactly opsRoles.
func opsPermissions(t *testing.T, dir string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(opsDir, "permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	passwords := map[string]string{}
	var users []string
	for _, m := range placeholderRe.FindAllStringSubmatch(text, -1) {
		user, pw := m[1], m[2]
		if pw != "change-me-"+user {
			t.Fatalf("permissions.conf: user %s has password %q, want the placeholder %q", user, pw, "change-me-"+user)
		}
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		passwords[user] = "pw-" + hex.EncodeToString(b)
		text = strings.Replace(text, `"`+pw+`"`, `"`+passwords[user]+`"`, 1)
		users = append(users, user)
	}
	sort.Strings(users)
	want := append([]string(nil), opsRoles...)
	sort.Strings(want)
	if strings.Join(users, ",") != strings.Join(want, ",") {
		t.Fatalf("permissions.conf users %v, want %v", users, want)
	}
	if n := strings.Count(text, `password: "change-me-`); n != 0 {
		t.Fatalf("permissions.conf: %d placeholders left after replacing one per user", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "permissions.conf"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return passwords
}

// rewriteConf copies ops/nats/<name> to dir/<name>, replacing each old text (which must occur exactly
// once) with its new text.
func rewriteConf(t *testing.T, dir, name string, repl ...string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(opsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for i := 0; i+1 < len(repl); i += 2 {
		if n := strings.Count(text, repl[i]); n != 1 {
			t.Fatalf("%s: %q occurs %d times, want once (the test rewrites it)", name, repl[i], n)
		}
		text = strings.Replace(text, repl[i], repl[i+1], 1)
	}
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// opsSingleConf prepares single.conf (clients on a free port, no monitoring port, data in storeDir).
func opsSingleConf(t *testing.T, storeDir string) (conf, url string, passwords map[string]string) {
	t.Helper()
	dir := t.TempDir()
	passwords = opsPermissions(t, dir)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	conf = rewriteConf(t, dir, "single.conf",
		"listen: 127.0.0.1:4222", "listen: "+listen,
		"http: 127.0.0.1:8222", "# http: off in the test",
		`store_dir: "/var/lib/nats"`, fmt.Sprintf("store_dir: %q", storeDir),
		"# include ./permissions.conf", "include ./permissions.conf")
	return conf, "nats://" + listen, passwords
}

// opsServer is a server running ops/nats's configuration and the users' passwords.
type opsServer struct {
	url       string
	passwords map[string]string
	log       *violationLog // the embedded server's
	nodes     []*proc       // real nats-server processes, which log their refusals
}

// violations are the refusals the server logged so far ("Publish Violation - …" with the user).
func (s *opsServer) violations() []string {
	if s.log != nil {
		return s.log.all()
	}
	var out []string
	for _, n := range s.nodes {
		for _, line := range strings.Split(n.Output(), "\n") {
			if strings.Contains(line, "Violation") {
				out = append(out, line)
			}
		}
	}
	return out
}

// startOpsSingle runs single.conf with permissions.conf on an embedded server (nats-server's own
// configuration loader and server, in the test process) and records the violations it logs.
func startOpsSingle(t *testing.T) *opsServer {
	t.Helper()
	store := t.TempDir()
	conf, url, passwords := opsSingleConf(t, store)
	base, err := natsserver.LoadServerConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsserver.StartServer(natsserver.ServerConfig{StoreDir: store, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	if srv.ClientURL() != url {
		t.Fatalf("server listens on %s, single.conf was rewritten to %s", srv.ClientURL(), url)
	}
	vl := &violationLog{}
	srv.NATS().SetLoggerV2(vl, false, false, false)
	return &opsServer{url: url, passwords: passwords, log: vl}
}

// env is the environment of an fpmbus process logging in as user.
func (s *opsServer) env(user string) []string {
	return []string{"NATS_URL=" + s.url, "NATS_USER=" + user, "NATS_PASSWORD=" + s.passwords[user]}
}

// start runs an fpmbus component as user.
func (s *opsServer) start(t *testing.T, user, name string, args ...string) *proc {
	t.Helper()
	return startFpmbus(t, name+" as "+user, s.env(user), args...)
}

// run runs an fpmbus command as user to completion; it must succeed.
func (s *opsServer) run(t *testing.T, user string, args ...string) string {
	t.Helper()
	r := runFpmbus(t, s.env(user), args...)
	if r.code != 0 {
		t.Fatalf("fpmbus %s as %s: exit %d\n%s", strings.Join(args, " "), user, r.code, r.out)
	}
	return r.out
}

// nats runs the nats CLI as user; it must succeed.
func (s *opsServer) nats(t *testing.T, user string, args ...string) string {
	t.Helper()
	out, err := run(t, 20*time.Second, natsBin, append([]string{"--server", s.url, "--user", user, "--password", s.passwords[user]}, args...)...)
	if err != nil {
		t.Fatalf("nats %s as %s: %v\n%s", strings.Join(args, " "), user, err, out)
	}
	return out
}

// client connects a nats.go client as user; refusals the server sends it are collected by its
// permission errors.
func (s *opsServer) client(t *testing.T, user string) *opsClient {
	t.Helper()
	c := &opsClient{}
	nc, err := nats.Connect(s.url, nats.UserInfo(user, s.passwords[user]), nats.Name("e2e-"+user),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { c.add(err) }))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	c.nc = nc
	return c
}

// opsClient is a nats.go client of one user and the asynchronous errors the server sent it.
type opsClient struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	mu   sync.Mutex
	errs []error
}

func (c *opsClient) add(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

// refused waits up to d for the server's refusal of subject and returns nats.go's error text for it.
func (c *opsClient) refused(subject string, d time.Duration) (string, bool) {
	want := fmt.Sprintf("Permissions Violation for Publish to %q", subject)
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		for _, err := range c.errs {
			if strings.Contains(err.Error(), want) {
				c.mu.Unlock()
				return err.Error(), true
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			return "", false
		}
	}
}

// violationLog keeps the permission violations an embedded server logs ("Publish Violation - Subject
// ..." and "Subscription Violation - ..." with the client's account and user in the line's prefix).
type violationLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *violationLog) record(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	if strings.Contains(line, "Violation") {
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
	}
}

func (l *violationLog) Noticef(format string, v ...any) { l.record(format, v...) }
func (l *violationLog) Warnf(format string, v ...any)   { l.record(format, v...) }
func (l *violationLog) Fatalf(format string, v ...any)  { l.record(format, v...) }
func (l *violationLog) Errorf(format string, v ...any)  { l.record(format, v...) }
func (l *violationLog) Debugf(format string, v ...any)  {}
func (l *violationLog) Tracef(format string, v ...any)  {}

// all returns every violation logged so far.
func (l *violationLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// has reports whether the server logged that user was refused subject.
func (l *violationLog) has(user, subject string) bool {
	for _, line := range l.all() {
		if strings.Contains(line, `/user:`+user+`"`) && strings.Contains(line, fmt.Sprintf("Subject %q", subject)) {
			return true
		}
	}
	return false
}

var _ server.Logger = (*violationLog)(nil)

// natsServerBin is the real nats-server for TestOpsClusterOnTheRealNatsServer: FPMBUS_NATS_SERVER_BIN,
// which `./taskw test` sets after building it from the version in go.mod (task tools:nats-server).
func natsServerBin(t testing.TB) string {
	t.Helper()
	p := os.Getenv("FPMBUS_NATS_SERVER_BIN")
	if p == "" {
		t.Skip("FPMBUS_NATS_SERVER_BIN is not set: run through `./taskw test`, which builds nats-server " +
			"from the version in go.mod into ./bin (task tools:nats-server) and sets it")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("FPMBUS_NATS_SERVER_BIN: %v", err)
	}
	return p
}

// opsClusterConfs prepares cluster/n1.conf..n3.conf: the shipped client (422x) and route (622x) ports
// become free ports, everywhere they appear (listen, routes), monitoring is off, and each node's data
// goes to its own directory under the test's. It returns the nodes' files and client URLs.
func opsClusterConfs(t *testing.T) (confs, urls []string, passwords map[string]string) {
	t.Helper()
	dir := t.TempDir()
	passwords = opsPermissions(t, dir)
	client, route := make([]string, 3), make([]string, 3)
	for i := range 3 {
		client[i] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		route[i] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		urls = append(urls, "nats://"+client[i])
	}
	for i := range 3 {
		n := i + 1
		repl := []string{
			fmt.Sprintf("listen: 127.0.0.1:%d", 4222+i), "listen: " + client[i],
			fmt.Sprintf("http: 127.0.0.1:%d", 8222+i), "# http: off in the test",
			fmt.Sprintf(`store_dir: "/var/lib/nats/n%d"`, n), fmt.Sprintf("store_dir: %q", filepath.Join(dir, fmt.Sprintf("data-n%d", n))),
			fmt.Sprintf("listen: 127.0.0.1:%d", 6222+i), "listen: " + route[i],
			"# include ../permissions.conf", "include ../permissions.conf",
		}
		for j := range 3 {
			if j != i {
				repl = append(repl, fmt.Sprintf("nats-route://127.0.0.1:%d", 6222+j), "nats-route://"+route[j])
			}
		}
		confs = append(confs, rewriteConf(t, dir, fmt.Sprintf("cluster/n%d.conf", n), repl...))
	}
	return confs, urls, passwords
}

// serverUser is a user of a loaded server configuration.
type serverUser = server.User
