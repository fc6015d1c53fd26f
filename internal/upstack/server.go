package upstack

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// Server is the checked embedded server of one run (natsserver.Plan) and how the components
// authenticate to it.
type Server struct {
	Config natsserver.ServerConfig
	Listen string              // the client address, for the start log line
	From   string              // what sets the server's addresses: "--listen", or "--server-config FILE"
	Auth   string              // how clients authenticate, for logs
	Conn   natsconn.ConnConfig // the components' credentials
	Plan   *natsserver.Plan
}

// CredentialFlags are the flags that give the components' credentials, for hints.
const CredentialFlags = "the components' credentials on the embedded server: --user/--password (NATS_USER/NATS_PASSWORD), --token (NATS_TOKEN), --creds (NATS_CREDS), --nkey (NATS_NKEY), or --auth-token-file"

// ownDataDir takes the ownership lock of --data-dir dir (fsutil.OwnDir: <dir>/fpmbus.lock). A
// directory that is not one (a symbolic link included) is a usage error; one another process owns is
// refused (exit 1) naming it.
func ownDataDir(dir string) (*fsutil.Lock, error) {
	l, err := fsutil.OwnDir(dir, "fpmbus up")
	var held *fsutil.HeldError
	switch {
	case errors.As(err, &held):
		return nil, fmt.Errorf("--data-dir %s is in use: %w; stop that process, or give this one another --data-dir", dir, err)
	case err != nil:
		return nil, fmt.Errorf("%w: --data-dir: %v", ErrUsage, err)
	}
	if l.Previous != nil {
		slog.Warn("--data-dir taken over from an `fpmbus up` that ended without releasing it (killed?)", "data_dir", dir, "previous_owner", l.Previous.String())
	}
	return l, nil
}
