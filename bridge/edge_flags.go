package bridge

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/natsserver"
)

// edgeFlags are the flags of the edge topology (see Edge): --edge-dir turns it on.
type edgeFlags struct {
	cfg  edgenode.EdgeConfig
	fs   *flag.FlagSet
	sync natsserver.SyncPolicy
}

// RegisterEdgeFlags defines --edge-dir, --edge-remote, --edge-node, --edge-listen,
// --edge-central-domain, --edge-creds, --edge-sync and --edge-log on fs.
func RegisterEdgeFlags(fs *flag.FlagSet) *edgeFlags {
	f := &edgeFlags{fs: fs}
	fs.StringVar(&f.cfg.StoreDir, "edge-dir", "", "edge topology: publish to a node-local JetStream storing in this directory, a leaf node of --edge-remote")
	fs.StringVar(&f.cfg.Remotes, "edge-remote", "", "the central server's leafnode URL(s), nats-leaf://host:7422 (comma-separated)")
	fs.StringVar(&f.cfg.Node, "edge-node", "", "this node's name; its JetStream domain is edge-<node> (default: the hostname)")
	fs.StringVar(&f.cfg.Listen, "edge-listen", edgenode.DefaultEdgeListen, "client address of the node-local server (for the nats CLI on the node)")
	fs.StringVar(&f.cfg.CentralDomain, "edge-central-domain", edgenode.DefaultCentralDomain, "the central server's JetStream domain")
	fs.StringVar(&f.cfg.Credentials, "edge-creds", "", ".creds file the leaf node presents to the central server")
	f.sync = natsserver.DefaultSync
	fs.Var(&f.sync, "edge-sync", "fsync policy of the node-local server: always or an interval such as 1s")
	fs.BoolVar(&f.cfg.Logging, "edge-log", false, "log the node-local server's own lines to stderr")
	return f
}

// Enabled reports whether --edge-dir was given.
func (f *edgeFlags) Enabled() bool { return f.cfg.StoreDir != "" }

// Config returns the edge configuration once fs is parsed: the node name defaults to the hostname.
// An edge flag without --edge-dir, or a setting that cannot work, is an ErrInvalidConfig error.
func (f *edgeFlags) Config() (edgenode.EdgeConfig, error) {
	if !f.Enabled() {
		var stray string
		f.fs.Visit(func(fl *flag.Flag) {
			if stray == "" && fl.Name != "edge-dir" && strings.HasPrefix(fl.Name, "edge-") {
				stray = fl.Name
			}
		})
		if stray != "" {
			return edgenode.EdgeConfig{}, fmt.Errorf("%w: --%s needs --edge-dir", ErrInvalidConfig, stray)
		}
		return edgenode.EdgeConfig{}, nil
	}
	c := f.cfg
	c.Sync = f.sync
	if c.Node == "" {
		host, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("%w: --edge-node not given and no hostname: %v", ErrInvalidConfig, err)
		}
		c.Node = nodeName(host)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return c, nil
}

// nodeName is a JetStream domain token for host: its first label, every byte other than a letter, a
// digit, '-' or '_' written as '_'.
func nodeName(host string) string {
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	b := []byte(host)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}
