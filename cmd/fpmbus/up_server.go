package main

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
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// The embedded server of `fpmbus up`, secure by default. Without flags it listens on loopback and
// authenticates nobody, as before. --server-config runs it from a nats-server configuration file
// (accounts, users, nkeys, TLS, exactly the real server's format); --auth-token-file and
// --server-tls-cert/--server-tls-key cover the common case without one. fpmbus owns the JetStream store
// (<data-dir>/jetstream) and, when --listen is given, the client address. A server that would accept
// clients beyond loopback without authenticating them is refused (exit 2) unless --insecure says so.
// The components connect in-process and authenticate like any client: with the token of
// --auth-token-file, else with the credential flags (--user/--password, --token, --creds, --nkey).

// upServerOptions are the flags of the embedded server.
type upServerOptions struct {
	configFile    string
	authTokenFile string
	tlsCert       string
	tlsKey        string
	tlsClientCA   string
	insecure      bool
}

func upServerFlags(fs *flag.FlagSet) *upServerOptions {
	o := &upServerOptions{}
	fs.StringVar(&o.configFile, "server-config", "", "run the embedded server from this nats-server configuration file (accounts, users, nkeys, TLS); fpmbus still owns the store (--data-dir) and, when given, --listen")
	fs.StringVar(&o.authTokenFile, "auth-token-file", "", "clients must present the token in this file (created with a random token, mode 0600, when missing); the components use it")
	fs.StringVar(&o.tlsCert, "server-tls-cert", "", "the embedded server's TLS certificate (with --server-tls-key): clients must use TLS")
	fs.StringVar(&o.tlsKey, "server-tls-key", "", "the embedded server's TLS key")
	fs.StringVar(&o.tlsClientCA, "server-tls-ca", "", "clients must present a certificate signed by this CA (mutual TLS)")
	fs.BoolVar(&o.insecure, "insecure", false, "let the embedded server listen beyond loopback without authentication")
	return o
}

// upServer is the checked embedded server of one run and how the components authenticate to it.
type upServer struct {
	server    natsserver.ServerConfig
	listen    string              // the client address, for the start log line
	from      string              // what sets the server's addresses: "--listen", or "--server-config FILE"
	auth      string              // how clients authenticate, for logs
	conn      natsconn.ConnConfig // the components' credentials
	tokenPath string              // --auth-token-file to create, with token
	token     string
}

// upCredentialFlags are the flags that give the components' credentials, for hints.
const upCredentialFlags = "the components' credentials on the embedded server: --user/--password (NATS_USER/NATS_PASSWORD), --token (NATS_TOKEN), --creds (NATS_CREDS), --nkey (NATS_NKEY), or --auth-token-file"

// plan checks the server flags and returns the server to run; a bad value is a usage error naming its
// flag. Nothing is written: writeToken creates a missing token file once every setting is checked.
func (o *upServerOptions) plan(fset *flag.FlagSet, listen, storeDir string, creds *connOptions) (*upServer, error) {
	s := &upServer{server: natsserver.ServerConfig{StoreDir: storeDir, TLSCert: o.tlsCert, TLSKey: o.tlsKey, TLSClientCA: o.tlsClientCA}}
	listenFlag := flagprefix.Given(fset, "listen")
	if o.configFile == "" || listenFlag {
		s.server.Listen = listen
	}
	var base *server.Options
	if o.configFile != "" {
		var err error
		if base, err = natsserver.LoadServerConfig(o.configFile); err != nil {
			return nil, fmt.Errorf("%w: --server-config: %v", errUsage, err)
		}
		s.server.Base = base
	}
	switch {
	case o.tlsCert != "" && o.tlsKey == "":
		return nil, fmt.Errorf("%w: --server-tls-cert %s needs --server-tls-key", errUsage, o.tlsCert)
	case o.tlsKey != "" && o.tlsCert == "":
		return nil, fmt.Errorf("%w: --server-tls-key %s needs --server-tls-cert", errUsage, o.tlsKey)
	case o.tlsClientCA != "" && o.tlsCert == "":
		return nil, fmt.Errorf("%w: --server-tls-ca %s needs --server-tls-cert and --server-tls-key", errUsage, o.tlsClientCA)
	case o.tlsCert != "" && base != nil && base.TLSConfig != nil:
		return nil, fmt.Errorf("%w: --server-tls-cert and --server-config %s, which configures TLS already: use one", errUsage, o.configFile)
	case o.authTokenFile != "" && base != nil && (natsserver.Authenticates(base) || base.NoAuthUser != ""):
		return nil, fmt.Errorf("%w: --auth-token-file and --server-config %s, which sets authentication already: use one", errUsage, o.configFile)
	}
	var err error
	s.auth = "none"
	switch {
	case o.authTokenFile != "":
		// The components use the token: credentials from flags are a contradiction, from variables
		// (meant for other servers) are ignored.
		if given := creds.GivenCredentials(); len(given) > 0 {
			return nil, fmt.Errorf("%w: --auth-token-file and %s: the components use the token of --auth-token-file", errUsage, strings.Join(given, ", "))
		}
		if s.token, err = readAuthToken(o.authTokenFile); err != nil {
			return nil, err
		}
		if s.token == "" {
			s.tokenPath, s.token = o.authTokenFile, rand.Text() // 128 random bits, base32: nothing a shell or a URL mangles
		}
		s.server.AuthToken = s.token
		s.conn = natsconn.ConnConfig{Name: "fpmbus-up", Logger: slog.Default(), Token: s.token}
		s.auth = "token from " + o.authTokenFile
	default:
		if s.conn, err = creds.credentials(); err != nil {
			return nil, err
		}
	}
	switch {
	case o.authTokenFile != "":
	case o.configFile != "":
		s.auth = "as configured in " + o.configFile
	case o.tlsClientCA != "":
		s.auth = "client certificates signed by " + o.tlsClientCA
	}
	opts, err := s.server.Options()
	if err != nil {
		return nil, fmt.Errorf("%w: --server-tls-cert/--server-tls-key/--server-tls-ca: %v", errUsage, err)
	}
	port := opts.Port
	if port == server.RANDOM_PORT {
		port = 0
	}
	s.listen = net.JoinHostPort(opts.Host, strconv.Itoa(port))
	s.from = "--listen"
	if !listenFlag && o.configFile != "" {
		s.from = "--server-config " + o.configFile
	}
	if opts.TLSConfig != nil {
		s.auth += ", TLS"
	}
	if !natsserver.ListensOnLoopback(opts) {
		where := "--listen " + s.listen
		if !listenFlag && o.configFile != "" {
			where = fmt.Sprintf("--server-config %s listens on %s", o.configFile, s.listen)
		}
		switch {
		case !natsserver.Authenticates(opts) && !o.insecure:
			return nil, fmt.Errorf("%w: %s: beyond loopback the embedded server needs authentication (--auth-token-file FILE, "+
				"or --server-config FILE with users), or --insecure to let anyone who reaches it read and write every stream", errUsage, where)
		case !natsserver.Authenticates(opts):
			slog.Warn("--insecure: the embedded server listens beyond loopback without authentication; anyone who reaches it can read and write every stream", "listen", s.listen)
		case opts.TLSConfig == nil:
			slog.Warn("the embedded server listens beyond loopback without TLS: credentials and FPMs cross the network in clear (--server-tls-cert/--server-tls-key)", "listen", s.listen)
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
		return "", fmt.Errorf("%w: --auth-token-file: %v", errUsage, err)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return "", fmt.Errorf("%w: --auth-token-file %s is empty (delete it to have a token generated)", errUsage, path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		slog.Warn("--auth-token-file is readable by other users: chmod 600 it", "file", path, "mode", fmt.Sprintf("%#o", st.Mode().Perm()))
	}
	return tok, nil
}

// writeToken creates the missing token file, readable by its owner only; it never overwrites one.
func (s *upServer) writeToken() error {
	if s.tokenPath == "" {
		return nil
	}
	f, err := fsutil.CreateExclusive(s.tokenPath, os.O_WRONLY, 0o600) // never through a symbolic link
	if err != nil {
		return fmt.Errorf("%w: --auth-token-file: %v", errUsage, err)
	}
	_, err = f.WriteString(s.token + "\n")
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
