package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

func init() {
	register(command{
		name:    "version",
		summary: "print fpmbus's version, its VCS revision, and the nats-server and nats.go it is built with",
		run:     func(_ context.Context, args []string) error { return runVersion(args, os.Stdout) },
	})
}

// versionInfo is what `fpmbus version` reports, from the build information the Go toolchain embeds.
type versionInfo struct {
	Version    string `json:"version"`            // the module version; "(devel)" for a build from a checkout
	Revision   string `json:"revision,omitempty"` // the VCS revision built from
	Time       string `json:"revision_time,omitempty"`
	Modified   bool   `json:"modified,omitempty"` // the checkout had uncommitted changes
	Go         string `json:"go"`
	NATSServer string `json:"nats_server"` // the embedded server's module version
	NATSGo     string `json:"nats_go"`     // the client library's
}

func buildVersion() versionInfo {
	v := versionInfo{Version: "(unknown)", Go: runtime.Version(), NATSServer: "(unknown)", NATSGo: "(unknown)"}
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

func runVersion(args []string, out io.Writer) error {
	fs := newFlagSet("version", "version [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v := buildVersion()
	if *asJSON {
		return writeJSON(out, v)
	}
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
