package natsconn_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/internal/natsconn"
)

// writeContext stores a nats CLI context under a fresh XDG_CONFIG_HOME, where the nats CLI keeps them.
func writeContext(t *testing.T, name, body string) string {
	t.Helper()
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	dir := filepath.Join(cfg, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A context file as `nats context save` writes it is read field by field, paths expanded and secret
// references resolved as the nats CLI does.
func TestLoadNATSContext(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("FPMBUS_TEST_SECRET", "pw-from-env")
	t.Setenv("CERTS", "/etc/certs")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("tok-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeContext(t, "prod", `{
  "description": "production",
  "url": "nats://a:4222,nats://b:4222",
  "user": "bridge",
  "password": "env://FPMBUS_TEST_SECRET",
  "token": "file://`+tokenFile+`",
  "creds": "~/creds/bridge.creds",
  "nkey": "",
  "cert": "$CERTS/client.pem",
  "key": "file://$CERTS/client-key.pem",
  "ca": "/etc/certs/ca.pem",
  "tls_first": true,
  "color_scheme": "",
  "jetstream_domain": ""
}`)
	got, err := natsconn.LoadNATSContext("prod")
	if err != nil {
		t.Fatal(err)
	}
	want := natsconn.NATSContext{Name: "prod", Path: path, URL: "nats://a:4222,nats://b:4222", User: "bridge",
		Password: "pw-from-env", Token: "tok-from-file", Creds: filepath.Join(home, "creds/bridge.creds"),
		Cert: "/etc/certs/client.pem", Key: "/etc/certs/client-key.pem", CA: "/etc/certs/ca.pem", TLSFirst: true}
	if *got != want {
		t.Fatalf("got  %+v\nwant %+v", *got, want)
	}
	// The nats CLI also takes the path of a context file.
	byPath, err := natsconn.LoadNATSContext(path)
	if err != nil || byPath.URL != want.URL || byPath.Path != path {
		t.Fatalf("by path: %+v, %v", byPath, err)
	}
	// Without XDG_CONFIG_HOME the file is under ~/.config.
	t.Setenv("XDG_CONFIG_HOME", "")
	p, err := natsconn.NATSContextPath("prod")
	if err != nil || p != filepath.Join(home, ".config", "nats", "context", "prod.json") {
		t.Fatalf("path without XDG_CONFIG_HOME: %q, %v", p, err)
	}
}

// A context fpmbus cannot honour completely is refused, naming the field; so is a missing or malformed
// one, and a name that would leave the context directory.
func TestLoadNATSContextRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		ctxName, body, want string
	}{
		"missing":               {"other", `{}`, "no such file"},
		"not JSON":              {"c", `{"url": `, "unexpected end"},
		"JetStream domain":      {"c", `{"jetstream_domain": "hub"}`, "jetstream_domain"},
		"inbox prefix":          {"c", `{"inbox_prefix": "_X"}`, "inbox_prefix"},
		"inline JWT":            {"c", `{"user_jwt": "eyJ", "user_seed": "SU"}`, "user_jwt"},
		"SOCKS proxy":           {"c", `{"socks_proxy": "socks5://p:1080"}`, "socks_proxy"},
		"op:// password":        {"c", `{"user": "u", "password": "op://vault/item/pw"}`, "op://"},
		"unset env:// token":    {"c", `{"token": "env://FPMBUS_TEST_UNSET_VARIABLE"}`, "FPMBUS_TEST_UNSET_VARIABLE"},
		"name leaves the dir":   {"../c", `{}`, `".."`},
		"name with a separator": {"a/c", `{}`, `"/"`},
	} {
		t.Run(name, func(t *testing.T) {
			writeContext(t, "c", tc.body)
			_, err := natsconn.LoadNATSContext(tc.ctxName)
			if !errors.Is(err, natsconn.ErrNATSContext) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrNATSContext saying %q", err, tc.want)
			}
		})
	}
}
