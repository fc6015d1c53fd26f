package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{name: "streams", summary: "show or apply the JetStream streams (show | apply)", run: runStreams})
}

func runStreams(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: fpmbus streams show|apply [flags]", errUsage)
	}
	switch args[0] {
	case "show":
		fs := newFlagSet("streams show", "streams show [--replicas N …] [--stream NAME]")
		cfg := streamFlags(fs)
		only := fs.String("stream", "", "print only this stream's config (a plain object for `nats stream add --config`)")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if *only != "" {
			for _, sc := range cfg.All() {
				if sc.Name == *only {
					return enc.Encode(sc)
				}
			}
			return fmt.Errorf("%w: --stream %q: no such stream (FPM, FPM_EVENTS, FPM_BENCH)", errUsage, *only)
		}
		return enc.Encode(cfg.All())
	case "apply":
		fs := newFlagSet("streams apply", "streams apply [--server URL] [--replicas N …]")
		conn := connFlags(fs, "streams")
		cfg := streamFlags(fs)
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		nc, err := streams.Connect(*conn)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := streams.Apply(actx, js, *cfg); err != nil {
			return err
		}
		for _, sc := range cfg.All() {
			slog.Info("stream applied", "stream", sc.Name, "subjects", sc.Subjects, "replicas", sc.Replicas)
		}
		return nil
	}
	return fmt.Errorf("%w: fpmbus streams: unknown action %q (show | apply)", errUsage, args[0])
}
