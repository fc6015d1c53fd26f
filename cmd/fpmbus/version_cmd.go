package main

import (
	"context"
	"io"
	"os"

	"github.com/fpmbus/fpmbus/internal/buildinfo"
)

func init() {
	register(command{
		name:    "version",
		summary: "print fpmbus's version, its VCS revision, and the nats-server and nats.go it is built with",
		run:     func(_ context.Context, args []string) error { return runVersion(args, os.Stdout) },
	})
}

func runVersion(args []string, out io.Writer) error {
	fs := newFlagSet("version", "version [--json]")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v := buildinfo.Read()
	if *asJSON {
		return writeJSON(out, v)
	}
	return v.WriteText(out)
}
