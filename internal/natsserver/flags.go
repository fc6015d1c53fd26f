package natsserver

import (
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/invalid"
)

// The embedded server's flags (`fpmbus up`), secure by default. Without flags it listens on loopback and
// authenticates nobody, as before. --server-config runs it from a nats-server configuration file
// (accounts, users, nkeys, TLS, exactly the real server's format); --auth-token-file and
// --server-tls-cert/--server-tls-key cover the common case without one. fpmbus owns the JetStream store
// (<data-dir>/jetstream) and, when --listen is given, the client address. A server that would accept
// clients beyond loopback without authenticating them is refused (exit 2) unless --insecure says so.
// The components connect in-process and authenticate like any client: with the token of
// --auth-token-file, else with the credential flags (--user/--password, --token, --creds, --nkey),
// which internal/natsconn defines. A bad value is an invalid.FlagError naming its flag.

// Flags are the flags of the embedded server.
type Flags struct {
	fs            *flag.FlagSet
	configFile    string
	authTokenFile string
	tlsCert       string
	tlsKey        string
	tlsClientCA   string
	insecure      bool
}

// RegisterFlags registers the embedded server's flags on fs: --server-config, --auth-token-file,
// --server-tls-cert, --server-tls-key, --server-tls-ca, --insecure.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	o := &Flags{fs: fs}
	fs.StringVar(&o.configFile, "server-config", "", "run the embedded server from this nats-server configuration file (accounts, users, nkeys, TLS); fpmbus still owns the store (--data-dir) and, when given, --listen")
	fs.StringVar(&o.authTokenFile, "auth-token-file", "", "clients must present the token in this file (created with a random token, mode 0600, when missing); the components use it")
	fs.StringVar(&o.tlsCert, "server-tls-cert", "", "the embedded server's TLS certificate (with --server-tls-key): clients must use TLS")
	fs.StringVar(&o.tlsKey, "server-tls-key", "", "the embedded server's TLS key")
	fs.StringVar(&o.tlsClientCA, "server-tls-ca", "", "clients must present a certificate signed by this CA (mutual TLS)")
	fs.BoolVar(&o.insecure, "insecure", false, "let the embedded server listen beyond loopback without authentication")
	return o
}

// Plan is the checked embedded server of one run and how the components authenticate to it.
type Plan struct {
	Server ServerConfig
	Listen string // the client address, for the start log line
	From   string // what sets the server's addresses: "--listen", or "--server-config FILE"
	Auth   string // how clients authenticate, for logs
	// Token is what the components present (--auth-token-file); "": their credential flags.
	Token     string
	tokenPath string // --auth-token-file to create, with Token
}

// Plan checks the server flags and returns the server to run, listening on listen (--listen, on the
// same FlagSet) with its store in storeDir. givenCredentials are the credential flags given on the
// command line; checkCredentials checks them when the components use them (no --auth-token-file). A
// bad value is an invalid.FlagError naming its flag. Nothing is written: WriteToken creates a missing
// token file once every setting is checked.
func (o *Flags) Plan(listen, storeDir string, givenCredentials []string, checkCredentials func() error) (*Plan, error) {
	s := &Plan{Server: ServerConfig{StoreDir: storeDir, TLSCert: o.tlsCert, TLSKey: o.tlsKey, TLSClientCA: o.tlsClientCA}}
	listenFlag := flagprefix.Given(o.fs, "listen")
	if o.configFile == "" || listenFlag {
		s.Server.Listen = listen
	}
	var base *server.Options
	if o.configFile != "" {
		var err error
		if base, err = LoadServerConfig(o.configFile); err != nil {
			return nil, invalid.Flagf("--server-config: %v", err)
		}
		s.Server.Base = base
	}
	switch {
	case o.tlsCert != "" && o.tlsKey == "":
		return nil, invalid.Flagf("--server-tls-cert %s needs --server-tls-key", o.tlsCert)
	case o.tlsKey != "" && o.tlsCert == "":
		return nil, invalid.Flagf("--server-tls-key %s needs --server-tls-cert", o.tlsKey)
	case o.tlsClientCA != "" && o.tlsCert == "":
		return nil, invalid.Flagf("--server-tls-ca %s needs --server-tls-cert and --server-tls-key", o.tlsClientCA)
	case o.tlsCert != "" && base != nil && base.TLSConfig != nil:
		return nil, invalid.Flagf("--server-tls-cert and --server-config %s, which configures TLS already: use one", o.configFile)
	case o.authTokenFile != "" && base != nil && (Authenticates(base) || base.NoAuthUser != ""):
		return nil, invalid.Flagf("--auth-token-file and --server-config %s, which sets authentication already: use one", o.configFile)
	}
	var err error
	s.Auth = "none"
	switch {
	case o.authTokenFile != "":
		// The components use the token: credentials from flags are a contradiction, from variables
		// (meant for other servers) are ignored.
		if given := givenCredentials; len(given) > 0 {
			return nil, invalid.Flagf("--auth-token-file and %s: the components use the token of --auth-token-file", strings.Join(given, ", "))
		}
		if s.Token, err = readAuthToken(o.authTokenFile); err != nil {
			return nil, err
		}
		if s.Token == "" {
			s.tokenPath, s.Token = o.authTokenFile, rand.Text() // 128 random bits, base32: nothing a shell or a URL mangles
		}
		s.Server.AuthToken = s.Token
		s.Auth = "token from " + o.authTokenFile
	default:
		if err = checkCredentials(); err != nil {
			return nil, err
		}
	}
	switch {
	case o.authTokenFile != "":
	case o.configFile != "":
		s.Auth = "as configured in " + o.configFile
	case o.tlsClientCA != "":
		s.Auth = "client certificates signed by " + o.tlsClientCA
	}
	opts, err := s.Server.Options()
	if err != nil {
		return nil, invalid.Flagf("--server-tls-cert/--server-tls-key/--server-tls-ca: %v", err)
	}
	port := opts.Port
	if port == server.RANDOM_PORT {
		port = 0
	}
	s.Listen = net.JoinHostPort(opts.Host, strconv.Itoa(port))
	s.From = "--listen"
	if !listenFlag && o.configFile != "" {
		s.From = "--server-config " + o.configFile
	}
	if opts.TLSConfig != nil {
		s.Auth += ", TLS"
	}
	if !ListensOnLoopback(opts) {
		where := "--listen " + s.Listen
		if !listenFlag && o.configFile != "" {
			where = fmt.Sprintf("--server-config %s listens on %s", o.configFile, s.Listen)
		}
		switch {
		case !Authenticates(opts) && !o.insecure:
			return nil, invalid.Flagf("%s: beyond loopback the embedded server needs authentication (--auth-token-file FILE, "+
				"or --server-config FILE with users), or --insecure to let anyone who reaches it read and write every stream", where)
		case !Authenticates(opts):
			slog.Warn("--insecure: the embedded server listens beyond loopback without authentication; anyone who reaches it can read and write every stream", "listen", s.Listen)
		case opts.TLSConfig == nil:
			slog.Warn("the embedded server listens beyond loopback without TLS: credentials and FPMs cross the network in clear (--server-tls-cert/--server-tls-key)", "listen", s.Listen)
		}
	}
	return s, nil
}

// readAuthToken returns the token in path, "" when the file does not exist yet. The file must be a
// regular file: a symbolic link (someone else's file as the server's secret) or a named pipe (a read
// that never ends) is refused.
func readAuthToken(path string) (string, error) {
	raw, st, err := fsutil.ReadRegular(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", invalid.Flagf("--auth-token-file: %v", err)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return "", invalid.Flagf("--auth-token-file %s is empty (delete it to have a token generated)", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		slog.Warn("--auth-token-file is readable by other users: chmod 600 it", "file", path, "mode", fmt.Sprintf("%#o", st.Mode().Perm()))
	}
	return tok, nil
}

// WriteToken creates the missing token file, readable by its owner only; it never overwrites one.
func (s *Plan) WriteToken() error {
	if s.tokenPath == "" {
		return nil
	}
	f, err := fsutil.CreateExclusive(s.tokenPath, os.O_WRONLY, 0o600) // never through a symbolic link
	if err != nil {
		return invalid.Flagf("--auth-token-file: %v", err)
	}
	_, err = f.WriteString(s.Token + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--auth-token-file %s: %w", s.tokenPath, err)
	}
	slog.Info("generated the embedded server's auth token (mode 0600); clients read it, e.g. NATS_TOKEN=$(cat FILE)", "file", s.tokenPath)
	return nil
}
