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

// envOr returns the trimmed value of the environment variable name, or def when unset or blank.
func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// envInt returns an integer environment default; a malformed value is reported with the variable's name.
func envInt(name string, def int) (int, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not an integer", errUsage, name, v)
	}
	return n, nil
}

// connFlags registers the flags that say how to reach an external NATS server.
func connFlags(fs *flag.FlagSet, name string) *streams.ConnConfig {
	c := &streams.ConnConfig{Name: "fpmbus-" + name}
	fs.StringVar(&c.URL, "server", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated (env NATS_URL)")
	fs.StringVar(&c.Creds, "creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&c.User, "user", os.Getenv("NATS_USER"), "NATS user (env NATS_USER)")
	fs.StringVar(&c.Pass, "password", os.Getenv("NATS_PASSWORD"), "NATS password (env NATS_PASSWORD)")
	fs.StringVar(&c.Token, "token", os.Getenv("NATS_TOKEN"), "NATS token (env NATS_TOKEN)")
	fs.StringVar(&c.TLSCA, "tls-ca", os.Getenv("NATS_CA"), "CA certificate to verify the server (env NATS_CA)")
	fs.StringVar(&c.TLSCert, "tls-cert", os.Getenv("NATS_CERT"), "client certificate for mutual TLS (env NATS_CERT)")
	fs.StringVar(&c.TLSKey, "tls-key", os.Getenv("NATS_KEY"), "client key for mutual TLS (env NATS_KEY)")
	return c
}

// streamFlags registers the server-side stream settings.
func streamFlags(fs *flag.FlagSet) *streams.Config {
	c := streams.DefaultConfig()
	fs.IntVar(&c.Replicas, "replicas", c.Replicas, "stream replicas (1 for one node, 3 for a cluster)")
	fs.DurationVar(&c.MaxAge, "max-age", c.MaxAge, "how long the FPM stream keeps messages")
	fs.Int64Var(&c.MaxBytes, "max-bytes", c.MaxBytes, "size limit of the FPM stream in bytes (-1: none)")
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
// existing stream is used as it is): how every command that runs against an external server starts.
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
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := streams.Ensure(actx, js, *scfg, slog.Default()); err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
