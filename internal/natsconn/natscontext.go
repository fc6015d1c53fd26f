package natsconn

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// A nats CLI context (`nats context save NAME`) names a set of connection settings, stored as
// <config>/nats/context/NAME.json with <config> = $XDG_CONFIG_HOME, else ~/.config. LoadNATSContext
// reads one as the nats CLI does (natscontext in github.com/nats-io/jsm.go): the same file, the same
// field names, paths expanded ($VAR, a leading ~), and secrets given as env://VARIABLE or file://PATH
// resolved. A context that holds a setting fpmbus cannot apply (a JetStream domain or API prefix, an
// inbox prefix, a SOCKS proxy, inline JWT and seed, nsc:// or op:// references, the Windows certificate
// store) is refused rather than half applied: connecting elsewhere, or as someone else, than the
// context says would be worse than not connecting.
//
// Why fpmbus reads the file itself rather than through jsm.go's natscontext package (v0.5.1 resolves
// against this module's nats.go and nats-server without changing them): that package finds ~ and
// ~/.config from the account's passwd entry (user.Current), not from $HOME as the rest of fpmbus and
// its tests do; it gives a context without a URL nats://127.0.0.1:4222 instead of leaving the URL
// to the --server flag; it runs the nsc binary while loading a context that names an nsc lookup, where
// fpmbus refuses it before anything runs; and it resolves env:// and file:// secrets only inside the
// nats.Options it builds, while fpmbus needs the values in a ConnConfig (validated, and named when the
// server refuses them). Using it would change what a context resolves to, and it would bring
// jsm.go's own dependencies into the binary for a JSON file of a dozen fields.

// ErrNATSContext is wrapped by every error LoadNATSContext returns.
var ErrNATSContext = errors.New("streams: nats context")

// NATSContext is what a nats CLI context says about reaching NATS, secrets resolved.
type NATSContext struct {
	Name     string
	Path     string // the file it was read from
	URL      string
	User     string
	Password string
	Token    string
	Creds    string // credentials file
	NKey     string // nkey seed file
	Cert     string // client certificate
	Key      string // its key
	CA       string
	TLSFirst bool
}

// natsContextFile is the JSON of a context file, field names as natscli writes them.
type natsContextFile struct {
	Description string `json:"description"`
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	TLSFirst    bool   `json:"tls_first"`
	ColorScheme string `json:"color_scheme"`
	// Settings fpmbus does not apply: a context that sets one is refused.
	SocksProxy          string   `json:"socks_proxy"`
	NSCLookup           string   `json:"nsc"`
	JSDomain            string   `json:"jetstream_domain"`
	JSAPIPrefix         string   `json:"jetstream_api_prefix"`
	JSEventPrefix       string   `json:"jetstream_event_prefix"`
	InboxPrefix         string   `json:"inbox_prefix"`
	UserJWT             string   `json:"user_jwt"`
	UserSeed            string   `json:"user_seed"`
	WinCertStoreType    string   `json:"windows_cert_store"`
	WinCertStoreMatchBy string   `json:"windows_cert_match_by"`
	WinCertStoreMatch   string   `json:"windows_cert_match"`
	WinCertStoreCaMatch []string `json:"windows_ca_certs_match"`
}

// NATSContextPath is where the context name is stored: name itself when it is the path of an existing
// .json file (as the nats CLI accepts), else <config>/nats/context/<name>.json.
func NATSContextPath(name string) (string, error) {
	if strings.HasSuffix(name, ".json") {
		if st, err := os.Stat(name); err == nil && !st.IsDir() {
			return name, nil
		}
	}
	switch {
	case name == "":
		return "", fmt.Errorf("%w: empty name", ErrNATSContext)
	case strings.Contains(name, ".."), strings.ContainsAny(name, `/\`):
		return "", fmt.Errorf("%w %q: a name has no \"..\", \"/\" or \"\\\" (or is the path of an existing .json file)", ErrNATSContext, name)
	}
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("%w %q: no home directory to find it in: %v", ErrNATSContext, name, err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "nats", "context", name+".json"), nil
}

// LoadNATSContext reads the nats CLI context name.
func LoadNATSContext(name string) (*NATSContext, error) {
	path, err := NATSContextPath(name)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrNATSContext, name, err)
	}
	var f natsContextFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%w %q: %s: %v", ErrNATSContext, name, path, err)
	}
	for _, u := range []struct {
		field string
		set   bool
	}{
		{"socks_proxy", f.SocksProxy != ""}, {"nsc", f.NSCLookup != ""}, {"jetstream_domain", f.JSDomain != ""},
		{"jetstream_api_prefix", f.JSAPIPrefix != ""}, {"jetstream_event_prefix", f.JSEventPrefix != ""},
		{"inbox_prefix", f.InboxPrefix != ""}, {"user_jwt", f.UserJWT != ""}, {"user_seed", f.UserSeed != ""},
		{"windows_cert_store", f.WinCertStoreType != "" || f.WinCertStoreMatchBy != "" || f.WinCertStoreMatch != ""},
		{"windows_ca_certs_match", len(f.WinCertStoreCaMatch) > 0},
	} {
		if u.set {
			return nil, fmt.Errorf("%w %q: %s sets %s, which fpmbus does not support: use a context without it", ErrNATSContext, name, path, u.field)
		}
	}
	c := &NATSContext{Name: name, Path: path, URL: f.URL, User: f.User, TLSFirst: f.TLSFirst}
	bad := func(field string, err error) error {
		return fmt.Errorf("%w %q: %s: %s: %v", ErrNATSContext, name, path, field, err)
	}
	if c.Password, err = resolveSecret(f.Password); err != nil {
		return nil, bad("password", err)
	}
	if c.Token, err = resolveSecret(f.Token); err != nil {
		return nil, bad("token", err)
	}
	for _, p := range []struct {
		field string
		dst   *string
		v     string
	}{
		{"creds", &c.Creds, f.Creds}, {"nkey", &c.NKey, f.NKey}, {"cert", &c.Cert, f.Cert}, {"key", &c.Key, f.Key}, {"ca", &c.CA, f.CA},
	} {
		if *p.dst, err = resolvePath(p.v); err != nil {
			return nil, bad(p.field, err)
		}
	}
	return c, nil
}

// resolveSecret reads a password or token: env://NAME and file://PATH are looked up, anything else is
// the value itself (as the nats CLI does for a scheme it has no resolver for).
func resolveSecret(v string) (string, error) {
	switch scheme := refScheme(v); scheme {
	case "env":
		name := strings.TrimPrefix(v, "env://")
		val, ok := os.LookupEnv(name)
		if !ok || val == "" {
			return "", fmt.Errorf("variable %s (named by env://) is not set", name)
		}
		return val, nil
	case "file":
		raw, err := os.ReadFile(expandPath(strings.TrimPrefix(v, "file://")))
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(raw), "\r\n"), nil
	case "op", "nsc", "data":
		return "", fmt.Errorf("a %s:// reference, which fpmbus does not resolve", scheme)
	}
	return v, nil
}

// resolvePath reads a file setting: a path ($VAR and a leading ~ expanded) or file://PATH.
func resolvePath(v string) (string, error) {
	switch scheme := refScheme(v); scheme {
	case "", "file":
		return expandPath(strings.TrimPrefix(v, "file://")), nil
	case "env", "op", "nsc", "data":
		return "", fmt.Errorf("a %s:// reference, which fpmbus does not resolve for a file", scheme)
	}
	return expandPath(v), nil
}

// refScheme is the scheme of a credential reference, "" for a plain value.
func refScheme(v string) string {
	if strings.HasPrefix(v, "data:") {
		return "data"
	}
	u, err := url.Parse(v)
	if err != nil || len(u.Scheme) < 2 || !strings.Contains(v, "://") {
		return ""
	}
	return u.Scheme
}

// expandPath expands $VAR and a leading ~ as the nats CLI does for a context's paths.
func expandPath(p string) string {
	p = os.ExpandEnv(p)
	if strings.HasPrefix(p, "~") {
		if home, err := os.UserHomeDir(); err == nil {
			p = home + p[1:]
		}
	}
	return p
}
