// Package buildinfo is what a binary says about its own build: its module version, the VCS revision it
// was built from, the Go toolchain and the NATS server and client modules it embeds, all read from the
// build information the Go toolchain writes into it.
package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Info is what `fpmbus version` reports, from the build information the Go toolchain embeds.
type Info struct {
	Version    string `json:"version"`            // the module version; "(devel)" for a build from a checkout
	Revision   string `json:"revision,omitempty"` // the VCS revision built from
	Time       string `json:"revision_time,omitempty"`
	Modified   bool   `json:"modified,omitempty"` // the checkout had uncommitted changes
	Go         string `json:"go"`
	NATSServer string `json:"nats_server"` // the embedded server's module version
	NATSGo     string `json:"nats_go"`     // the client library's
}

// Read returns the running binary's Info; "(unknown)" for what its build information does not say.
func Read() Info {
	v := Info{Version: "(unknown)", Go: runtime.Version(), NATSServer: "(unknown)", NATSGo: "(unknown)"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Version = bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		switch d.Path {
		case "github.com/nats-io/nats-server/v2":
			v.NATSServer = d.Version
		case "github.com/nats-io/nats.go":
			v.NATSGo = d.Version
		}
	}
	return v
}

// WriteText writes v as two lines for a person.
func (v Info) WriteText(out io.Writer) error {
	rev := v.Revision
	if rev == "" {
		rev = "unknown revision"
	} else if v.Modified {
		rev += " (modified)"
	}
	if v.Time != "" {
		rev += ", " + v.Time
	}
	_, err := fmt.Fprintf(out, "fpmbus %s (%s)\n%s, nats-server %s, nats.go %s\n", v.Version, rev, v.Go, v.NATSServer, v.NATSGo)
	return err
}
