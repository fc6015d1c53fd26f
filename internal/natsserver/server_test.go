package natsserver_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// loadConf writes a nats-server configuration and loads it with the server's own loader.
func loadConf(t *testing.T, conf string) (*natsserver.ServerConfig, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	base, err := natsserver.LoadServerConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	return &natsserver.ServerConfig{StoreDir: t.TempDir(), Base: base}, path
}

// The embedded server runs a configuration file as nats-server would, except for what fpmbus owns: the
// store directory always, the client address when Listen is set. Without a listen address anywhere it
// listens on loopback, never on every interface.
func TestServerOptionsOwnStoreAndListen(t *testing.T) {
	for name, tc := range map[string]struct {
		conf, listen string
		wantHost     string
		wantPort     int
		loopback     bool
	}{
		"no listen anywhere: loopback":      {conf: "server_name: x\n", wantHost: "127.0.0.1", wantPort: 4222, loopback: true},
		"the file's listen":                 {conf: "listen: 127.0.0.2:4333\n", wantHost: "127.0.0.2", wantPort: 4333, loopback: true},
		"a port alone is every interface":   {conf: "port: 4333\n", wantHost: "", wantPort: 4333},
		"--listen overrides the file":       {conf: "listen: 0.0.0.0:4333\n", listen: "127.0.0.1:5000", wantHost: "127.0.0.1", wantPort: 5000, loopback: true},
		"the file's every-interface listen": {conf: "listen: 0.0.0.0:4333\n", wantHost: "0.0.0.0", wantPort: 4333},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, _ := loadConf(t, tc.conf+"jetstream { store_dir: /elsewhere }\n")
			cfg.Listen = tc.listen
			o, err := cfg.Options()
			if err != nil {
				t.Fatal(err)
			}
			if o.Host != tc.wantHost || o.Port != tc.wantPort || natsserver.ListensOnLoopback(o) != tc.loopback {
				t.Fatalf("listen %s:%d (loopback %v), want %s:%d (%v)", o.Host, o.Port, natsserver.ListensOnLoopback(o), tc.wantHost, tc.wantPort, tc.loopback)
			}
			if o.StoreDir != cfg.StoreDir || !o.JetStream || o.MaxPayload != natsserver.DefaultMaxPayload {
				t.Fatalf("store %q jetstream %v max payload %d: fpmbus's settings not applied", o.StoreDir, o.JetStream, o.MaxPayload)
			}
		})
	}
}

// The embedded server closes the connection of a client that stopped answering its pings within about
// 30 s (a frozen consumer group member keeps its partitions until then); a configuration file that sets
// its own ping settings keeps them.
func TestServerOptionsPingBound(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		conf     string
		interval time.Duration
		pings    int
	}{
		"fpmbus's bound":           {conf: "server_name: x\n", interval: natsserver.DefaultPingInterval, pings: natsserver.DefaultMaxPingsOut},
		"the file's ping settings": {conf: "ping_interval: \"1m\"\nping_max: 5\n", interval: time.Minute, pings: 5},
		"the file's interval only": {conf: "ping_interval: \"3s\"\n", interval: 3 * time.Second, pings: natsserver.DefaultMaxPingsOut},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, _ := loadConf(t, tc.conf)
			o, err := cfg.Options()
			if err != nil {
				t.Fatal(err)
			}
			if o.PingInterval != tc.interval || o.MaxPingsOut != tc.pings {
				t.Fatalf("pings every %v, %d outstanding at most; want %v, %d", o.PingInterval, o.MaxPingsOut, tc.interval, tc.pings)
			}
		})
	}
	o, err := (natsserver.ServerConfig{StoreDir: t.TempDir()}).Options()
	if err != nil {
		t.Fatal(err)
	}
	if bound := time.Duration(o.MaxPingsOut+1) * o.PingInterval; bound > 30*time.Second {
		t.Fatalf("a frozen client keeps its connection for %v", bound)
	}
}

// The shipped nats-server configurations close a frozen client as soon as the embedded server does.
func TestShippedServerConfigsPingBound(t *testing.T) {
	t.Parallel()
	confs, err := filepath.Glob("../../ops/nats/*.conf")
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := filepath.Glob("../../ops/nats/cluster/*.conf")
	n := 0
	for _, path := range append(confs, nodes...) {
		if filepath.Base(path) == "permissions.conf" { // included by the others, not a server's
			continue
		}
		o, err := natsserver.LoadServerConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if o.PingInterval != natsserver.DefaultPingInterval || o.MaxPingsOut != natsserver.DefaultMaxPingsOut {
			t.Errorf("%s: pings every %v, %d outstanding at most; the embedded server: %v, %d", path, o.PingInterval, o.MaxPingsOut,
				natsserver.DefaultPingInterval, natsserver.DefaultMaxPingsOut)
		}
		n++
	}
	if n < 5 {
		t.Fatalf("%d server configurations found under ops/nats", n)
	}
}

// requiresAuth is what `fpmbus up` asks before listening beyond loopback: every way nats-server has to
// make a client prove who it is counts, and no_auth_user (a door without a key) does not.
func TestServerAuthenticates(t *testing.T) {
	pki := natsservertest.NewPKI(t)
	for name, tc := range map[string]struct {
		conf  string
		token string
		want  bool
	}{
		"nothing":       {"", "", false},
		"token flag":    {"", "t0ken", true},
		"token in file": {"authorization { token: abc }", "", true},
		"single user":   {"authorization { user: a, password: b }", "", true},
		"users":         {"authorization { users: [ {user: a, password: b} ] }", "", true},
		"nkey users":    {"authorization { users: [ {nkey: UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4} ] }", "", true},
		"account users": {"accounts { A { jetstream: enabled, users: [ {user: a, password: b} ] } }", "", true},
		"no_auth_user":  {"accounts { A { users: [ {user: a, password: b} ] } }\nno_auth_user: a", "", false},
		"TLS only":      {fmt.Sprintf("tls { cert_file: %q, key_file: %q }", pki.ServerCert, pki.ServerKey), "", false},
		"mutual TLS":    {fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }", pki.ServerCert, pki.ServerKey, pki.CA), "", true},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, _ := loadConf(t, tc.conf+"\n")
			cfg.AuthToken = tc.token
			o, err := cfg.Options()
			if err != nil {
				t.Fatal(err)
			}
			if got := natsserver.Authenticates(o); got != tc.want {
				t.Fatalf("Authenticates = %v, want %v", got, tc.want)
			}
		})
	}
}

// Two sources for one setting are refused rather than merged.
func TestServerOptionsRefuseConflicts(t *testing.T) {
	pki := natsservertest.NewPKI(t)
	for name, tc := range map[string]struct {
		conf string
		set  func(*natsserver.ServerConfig)
	}{
		"token over users":        {"authorization { users: [ {user: a, password: b} ] }", func(c *natsserver.ServerConfig) { c.AuthToken = "x" }},
		"certificate over file's": {fmt.Sprintf("tls { cert_file: %q, key_file: %q }", pki.ServerCert, pki.ServerKey), func(c *natsserver.ServerConfig) { c.TLSCert, c.TLSKey = pki.ServerCert, pki.ServerKey }},
		"certificate without key": {"", func(c *natsserver.ServerConfig) { c.TLSCert = pki.ServerCert }},
		"client CA without cert":  {"", func(c *natsserver.ServerConfig) { c.TLSClientCA = pki.CA }},
		"key of another cert":     {"", func(c *natsserver.ServerConfig) { c.TLSCert, c.TLSKey = pki.ServerCert, pki.ClientKey }},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, _ := loadConf(t, tc.conf+"\n")
			tc.set(cfg)
			if _, err := cfg.Options(); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "[::1]": true, "localhost": true, "LOCALHOST": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "example.com": false,
	} {
		if got := natsserver.IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
