package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/envflag"
	"github.com/fpmbus/fpmbus/internal/flaghelp"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/streams"
)

// helpOutput receives -h output and flag errors (tests capture it).
var helpOutput io.Writer = os.Stderr

// flagSets records every FlagSet newFlagSet made, by command path ("streams show"); the README test
// reads it to check that every flag is documented.
var flagSets = map[string]*flag.FlagSet{}

// newFlagSet returns a FlagSet whose parse errors come back wrapped in errUsage; -h prints its synopsis
// and its flags by group (internal/flaghelp).
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("fpmbus "+name, flag.ContinueOnError)
	fs.SetOutput(helpOutput)
	flagSets[name] = fs
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: fpmbus %s\n\n", synopsis)
		flaghelp.Print(fs.Output(), fs)
	}
	return fs
}

// parseFlags parses args (flaghelp.Parse); a bad flag or an argument is a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error { return flagUsage(flaghelp.Parse(fs, args)) }

// parseInterleaved parses args where flags and positional arguments may come in any order and returns
// the positional ones (flaghelp.ParseInterleaved); a bad flag is a usage error.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	pos, err := flaghelp.ParseInterleaved(fs, args)
	return pos, flagUsage(err)
}

// parseStage parses the flags of a command that runs a stage (they leave no argument), makes the
// stage's configuration of them with config (whose errors are usage errors already), then checks the
// stream flags: the start every such command shares.
func parseStage[C any](fs *flag.FlagSet, args []string, scfg *streams.Config, config func() (C, error)) (C, error) {
	var cfg C
	if err := parseFlags(fs, args); err != nil {
		return cfg, err
	}
	cfg, err := config()
	if err != nil {
		return cfg, err
	}
	if err := scfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: %v", errUsage, err)
	}
	return cfg, nil
}

// streamFlags registers the server-side stream settings.
func streamFlags(fs *flag.FlagSet) *streams.Config {
	c := streams.DefaultConfig()
	flaghelp.InGroup(fs, "streams (declared at start)", func() { registerStreamFlags(fs, &c) })
	return &c
}

func registerStreamFlags(fs *flag.FlagSet, c *streams.Config) {
	c.RegisterFlags(fs)
	fs.Func("storage", "stream storage: file or memory (default file)", func(v string) error {
		st, err := storageFromFlag(v)
		c.Storage = st
		return err
	})
}

// fpmShardsFlag registers --fpm-shards (default FPMBUS_FPM_SHARDS) on c.FPMShards, for the commands
// that declare the FPM streams (streams show/apply, up); every other command reads the count from the
// server. Call the returned envDefaults' err after parsing.
func fpmShardsFlag(fs *flag.FlagSet, c *streams.Config) *envflag.Defaults {
	env := environment.Defaults(fs)
	fs.IntVar(&c.FPMShards, "fpm-shards", env.Int("fpm-shards", envFPMShards, 0),
		fmt.Sprintf("spread FPMs over N streams FPM_0 … FPM_<N-1> by publisher key, so that their leaders spread over a cluster (1: the single stream FPM; 0: what the server has, 1 on a new server; at most %d; fixed once created) (env %s)",
			streams.MaxFPMShards, envFPMShards))
	return env
}

// parseStreamFlags parses args into fs and checks what the stream flags and --fpm-shards (env) say,
// for the commands that declare streams.
func parseStreamFlags(fs *flag.FlagSet, args []string, env *envflag.Defaults, c *streams.Config) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := env.Err(); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
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

// usageError is err as a usage error (exit status 2) when it wraps the component's invalid sentinel:
// a component's Flags.Config refused a flag's value.
func usageError(err, invalid error) error {
	if errors.Is(err, invalid) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return err
}

// flagUsage is err as a usage error (exit status 2) when a package refused a flag's value before
// anything ran (invalid.FlagError, whose text names the flag).
func flagUsage(err error) error {
	if fe := (*invalid.FlagError)(nil); errors.As(err, &fe) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return err
}
