package bridge

import (
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/edgenode"
	"github.com/fpmbus/fpmbus/internal/natsserver"
)

func TestEdgeFlags(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	for name, tc := range map[string]struct {
		args    []string
		enabled bool
		bad     string // substring of the error; "" = valid
		check   func(*testing.T, edgenode.EdgeConfig)
	}{
		"off":                          {args: nil},
		"edge flag without --edge-dir": {args: []string{"--edge-remote", "nats-leaf://c:7422"}, bad: "--edge-remote needs --edge-dir"},
		"defaults": {args: []string{"--edge-dir", "/d", "--edge-remote", "nats-leaf://c:7422"}, enabled: true,
			check: func(t *testing.T, c edgenode.EdgeConfig) {
				if c.Node != nodeName(host) || c.Listen != edgenode.DefaultEdgeListen || c.CentralDomainOrDefault() != "central" || c.Sync != natsserver.DefaultSync {
					t.Fatalf("config %+v", c)
				}
			}},
		"all set": {args: []string{"--edge-dir", "/d", "--edge-remote", "nats-leaf://c:7422", "--edge-node", "gpu7",
			"--edge-listen", "127.0.0.1:0", "--edge-central-domain", "hub", "--edge-sync", "2s"}, enabled: true,
			check: func(t *testing.T, c edgenode.EdgeConfig) {
				if c.Domain() != "edge-gpu7" || c.CentralDomainOrDefault() != "hub" || c.Sync.Interval != 2*time.Second || c.Listen != "127.0.0.1:0" {
					t.Fatalf("config %+v", c)
				}
			}},
		"no remote":     {args: []string{"--edge-dir", "/d"}, enabled: true, bad: "no leafnode remote"},
		"bad node name": {args: []string{"--edge-dir", "/d", "--edge-remote", "nats-leaf://c:7422", "--edge-node", "a.b"}, enabled: true, bad: "node name"},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("bridge", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := RegisterEdgeFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if f.Enabled() != tc.enabled {
				t.Fatalf("Enabled %v, want %v", f.Enabled(), tc.enabled)
			}
			c, err := f.Config()
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("Config: %v, want ErrInvalidConfig naming %q", err, tc.bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

func TestNodeName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"gpu-01.cluster.local": "gpu-01", "node_7": "node_7", "a b+c": "a_b_c"} {
		if got := nodeName(in); got != want {
			t.Errorf("nodeName(%q) = %q, want %q", in, got, want)
		}
	}
}
