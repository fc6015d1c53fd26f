package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

// helpOutput receives -h output and flag errors (tests capture it).
var helpOutput io.Writer = os.Stderr

// flagSets records every FlagSet newFlagSet made, by command path ("streams show"); the README test
// reads it to check that every flag is documented.
var flagSets = map[string]*flag.FlagSet{}

// newFlagSet returns a FlagSet whose parse errors come back wrapped in errUsage.
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("fpmbus "+name, flag.ContinueOnError)
	fs.SetOutput(helpOutput)
	flagSets[name] = fs
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: fpmbus %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and wraps a bad flag in errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

// flagGiven reports whether the flag name was set on the command line (directly or through a
// deprecated alias, which sets its flag).
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			given = true
		}
	})
	return given
}

// connFlags registers the flags that say how to reach an external NATS server.
func connFlags(fs *flag.FlagSet, name string) *streams.ConnConfig {
	c := &streams.ConnConfig{Name: "fpmbus-" + name}
	fs.StringVar(&c.URL, "server", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated (env NATS_URL)")
	fs.StringVar(&c.Creds, "creds", envOr("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&c.User, "user", envOr("NATS_USER", ""), "NATS user (env NATS_USER)")
	fs.StringVar(&c.Pass, "password", envOr("NATS_PASSWORD", ""), "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&c.Token, "token", envOr("NATS_TOKEN", ""), "NATS token (env NATS_TOKEN)")
	fs.StringVar(&c.TLSCA, "tls-ca", envOr("NATS_CA", ""), "CA certificate to verify the server (env NATS_CA)")
	fs.StringVar(&c.TLSCert, "tls-cert", envOr("NATS_CERT", ""), "client certificate for mutual TLS (env NATS_CERT)")
	fs.StringVar(&c.TLSKey, "tls-key", envOr("NATS_KEY", ""), "client key for mutual TLS (env NATS_KEY)")
	return c
}

// streamFlags registers the server-side stream settings.
func streamFlags(fs *flag.FlagSet) *streams.Config {
	c := streams.DefaultConfig()
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "stream replicas (1 for one node, 3 for a cluster)")
	fs.DurationVar(&c.MaxAge, "max-age", c.MaxAge, "how long the FPM stream keeps messages")
	fs.Var((*maxBytesValue)(&c.MaxBytes), "max-bytes", "size limit of the FPM stream in bytes (-1: none)")
	fs.DurationVar(&c.EventsMaxAge, "events-max-age", c.EventsMaxAge, "how long FPM_EVENTS keeps events")
	fs.Int64Var(&c.EventsMaxBytes, "events-max-bytes", c.EventsMaxBytes, "size limit of FPM_EVENTS in bytes, oldest events dropped first (-1: none)")
	fs.DurationVar(&c.BenchMaxAge, "bench-max-age", c.BenchMaxAge, "how long FPM_BENCH keeps artefacts")
	fs.DurationVar(&c.DuplicateWindow, "duplicate-window", c.DuplicateWindow, "JetStream duplicate window (covers the bridge's retries only; ids are held in server memory)")
	fs.Func("storage", "stream storage: file or memory (default file)", func(v string) error {
		st, err := storageFromFlag(v)
		c.Storage = st
		return err
	})
	return &c
}

// maxBytesValue is --max-bytes: a positive size, or -1 for no limit.
type maxBytesValue int64

func (v *maxBytesValue) String() string {
	if v == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*v), 10)
}

func (v *maxBytesValue) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 1 && n != -1 {
		return fmt.Errorf("want a positive size in bytes, or -1 for no limit")
	}
	*v = maxBytesValue(n)
	return nil
}

// storageFromFlag maps --storage to a JetStream storage type.
func storageFromFlag(s string) (jetstream.StorageType, error) {
	switch strings.ToLower(s) {
	case "file":
		return jetstream.FileStorage, nil
	case "memory":
		return jetstream.MemoryStorage, nil
	}
	return 0, fmt.Errorf("%w: --storage %q: want file or memory", errUsage, s)
}

// connectAndApply connects to NATS, opens JetStream and ensures the streams exist (within 30 s; an
// existing stream is used as it is): how every command that runs against an external server starts. A
// nil scfg ensures nothing (commands that only read, or whose component ensures what it needs itself).
// The caller closes the connection.
func connectAndApply(ctx context.Context, conn *streams.ConnConfig, scfg *streams.Config) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := streams.Connect(*conn)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if scfg == nil {
		return nc, js, nil
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := streams.Ensure(actx, js, *scfg, slog.Default()); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
