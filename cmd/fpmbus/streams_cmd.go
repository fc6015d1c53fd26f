package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
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
		fs := newFlagSet("streams show", "streams show [--fpm-shards N] [--replicas N …] [--stream NAME]")
		cfg := streamFlags(fs)
		env := fpmShardsFlag(fs, cfg)
		only := fs.String("stream", "", "print only this stream's config (a plain object for `nats stream add --config`)")
		if err := parseStreamFlags(fs, args[1:], env, cfg); err != nil {
			return err
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
			return fmt.Errorf("%w: --stream %q: no such stream (FPM or, with --fpm-shards N, FPM_0 … FPM_<N-1>; FPM_EVENTS, FPM_BENCH)", errUsage, *only)
		}
		return enc.Encode(cfg.All())
	case "apply":
		fs := newFlagSet("streams apply", "streams apply [--server URL] [--fpm-shards N] [--replicas N …] [--dry-run] [--force]")
		conn := connFlags(fs, "streams")
		cfg := streamFlags(fs)
		env := fpmShardsFlag(fs, cfg)
		dryRun := fs.Bool("dry-run", false, "print what would change and change nothing (it only reads: it waits "+readOnlyConnTimeout.String()+" for the server unless --connect-timeout is given)")
		force := fs.Bool("force", false, "also apply changes that can delete stored messages (lower limits, fewer replicas, another storage type)")
		if err := parseStreamFlags(fs, args[1:], env, cfg); err != nil {
			return err
		}
		if *dryRun && !flagprefix.Given(fs, "connect-timeout") {
			// A dry run only reads, for a person waiting on its answer, as `datasets ls` does: a
			// missing server is said in seconds, not after the half minute a deployment step waits.
			conn.SetConnectTimeout(readOnlyConnTimeout)
		}
		nc, js, err := connectAndApply(ctx, conn, nil) // the plan applies the streams
		if err != nil {
			return err
		}
		defer nc.Close()
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return streams.PrintAndApply(actx, js, *cfg, *dryRun, *force, os.Stdout)
	}
	return fmt.Errorf("%w: fpmbus streams: unknown action %q (show | apply)", errUsage, args[0])
}
