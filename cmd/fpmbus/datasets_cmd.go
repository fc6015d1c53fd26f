package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "datasets",
		summary: "sealed FPM datasets in KV FPM_DATASETS: publish a dataset file, coverage of a plan, ls, get, history, predict",
		run:     runDatasets,
	})
}

const datasetsUsage = `fpmbus datasets publish|coverage|ls|get|history|predict [flags]

  publish FILE       validate a dataset file (schemas/jsonschema/dataset-file.schema.json) and seal its cells;
                     --plan FILE ties it to a frozen plan, --allow-partial seals the valid cells and exits 3
  coverage --plan F  covered, partial and missing cells of a plan, unsupported settings, estimated GPU-hours
  ls                 every sealed cell and campaign record
  get KEY            one sealed cell (cell.<sha256>) or campaign (campaign.<id>) as JSON
  history KEY        every revision of a key, and which ones readers ignore as tampering (a sealed cell is its first)
  predict            whole-forward latency of one step (flags) or many (--queries FILE) from the sealed cells;
                     exits 5 when a query is refused (each refusal with its reason)

Exit status: 0 done, 1 error or rejected (nothing written), 2 usage, 3 partial publication, 4 conflict,
5 some prediction refused.
Watch seals as they happen with: nats kv watch FPM_DATASETS`

func runDatasets(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, datasetsUsage)
	}
	out := io.Writer(os.Stdout)
	switch args[0] {
	case "publish":
		return runDatasetsPublish(ctx, args[1:], out)
	case "coverage":
		return runDatasetsCoverage(ctx, args[1:], out)
	case "ls":
		return runDatasetsLs(ctx, args[1:], out)
	case "get":
		return withDatasetKey(ctx, "get", args[1:], func(kv jetstream.KeyValue, key, arg string) error {
			return seal.WriteRecord(ctx, kv, key, arg, out)
		})
	case "history":
		return withDatasetKey(ctx, "history", args[1:], func(kv jetstream.KeyValue, key, _ string) error {
			return seal.WriteHistory(ctx, kv, key, out)
		})
	case "predict":
		return runDatasetsPredict(ctx, args[1:], out)
	case "-h", "--help", "help":
		fmt.Fprintln(out, datasetsUsage)
		return nil
	}
	return fmt.Errorf("%w: fpmbus datasets: unknown action %q\n%s", errUsage, args[0], datasetsUsage)
}

// datasetsFlagSet is the flag set of `datasets <action>` with the connection and stream flags every
// action takes. Every action but publish only reads: it waits readOnlyConnTimeout for the server.
func datasetsFlagSet(action, synopsis string) (*flag.FlagSet, *connOptions, *streams.Config) {
	fs := newFlagSet("datasets "+action, synopsis)
	if action == "publish" {
		return fs, connFlags(fs, "datasets"), streamFlags(fs)
	}
	return fs, readConnFlags(fs, "datasets"), streamFlags(fs)
}

// datasetsParse parses flags around exactly want positional arguments.
func datasetsParse(fs *flag.FlagSet, args []string, want int, what string) ([]string, error) {
	pos, err := parseInterleaved(fs, args)
	if err == nil && len(pos) != want {
		err = fmt.Errorf("%w: want %s", errUsage, what)
	}
	return pos, err
}

func openKV(ctx context.Context, conn *connOptions, scfg *streams.Config) (jetstream.KeyValue, func(), error) {
	s, _, nc, err := openSealer(ctx, conn, scfg, "fpmbus datasets")
	if err != nil {
		return nil, nil, err
	}
	return s.KV(), nc.Close, nil
}

func readPlan(path string) (*schemas.DatasetPlan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --plan: %v", errUsage, err)
	}
	defer f.Close()
	p, err := schemas.DecodePlan(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

func runDatasetsPublish(ctx context.Context, args []string, w io.Writer) error {
	fs, conn, scfg := datasetsFlagSet("publish", "datasets publish [--plan FILE] [--allow-partial] [--json] [--progress MODE] FILE")
	planPath := fs.String("plan", "", "the frozen plan (JSON) the dataset belongs to; default: a plan of exactly the file's cells")
	allowPartial := fs.Bool("allow-partial", false, "seal the cells that pass even when others are rejected or missing; exits 3 while the campaign is incomplete")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	progress := progressFlag(fs)
	pos, err := datasetsParse(fs, args, 1, "one dataset FILE")
	if err != nil {
		return err
	}
	show, err := progressMode(*progress, os.Stderr)
	if err != nil {
		return err
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return err
	}
	ds, err := schemas.DecodeDataset(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	var plan *schemas.DatasetPlan
	if *planPath != "" {
		if plan, err = readPlan(*planPath); err != nil {
			return err
		}
	}
	s, js, nc, err := openSealer(ctx, conn, scfg, "fpmbus datasets publish")
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := seal.Protect(ctx, js, slog.Default()); err != nil {
		slog.Error("FPM_DATASETS is not protected: a credential that may write it can purge or expire sealed history", "error", err)
	}
	meter := newProgressMeter(show, progressOut, "datasets publish", "cells")
	rep, perr := s.PublishDataset(ctx, ds, seal.PublishOptions{AllowPartial: *allowPartial, Plan: plan,
		Progress: func(done, total int) { meter.Update(uint64(done), uint64(total), "") }})
	meter.Finish()
	if *asJSON {
		if err := writeJSON(w, rep); err != nil {
			return err
		}
	} else {
		_ = rep.WriteText(w)
	}
	return perr
}

func runDatasetsCoverage(ctx context.Context, args []string, w io.Writer) error {
	fs, conn, scfg := datasetsFlagSet("coverage", "datasets coverage --plan FILE [--json]")
	planPath := fs.String("plan", "", "the plan (JSON, schemas.DatasetPlan) to check; required")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if _, err := datasetsParse(fs, args, 0, "no arguments besides flags"); err != nil {
		return err
	}
	if *planPath == "" {
		return fmt.Errorf("%w: --plan FILE is required", errUsage)
	}
	plan, err := readPlan(*planPath)
	if err != nil {
		return err
	}
	kv, closeConn, err := openKV(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer closeConn()
	rep, err := seal.Coverage(ctx, kv, plan)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(w, rep)
	}
	return rep.WriteText(w)
}

func runDatasetsLs(ctx context.Context, args []string, w io.Writer) error {
	fs, conn, scfg := datasetsFlagSet("ls", "datasets ls [--json] [--progress MODE]")
	asJSON := fs.Bool("json", false, "print JSON lines, one per key")
	progress := progressFlag(fs)
	if _, err := datasetsParse(fs, args, 0, "no arguments besides flags"); err != nil {
		return err
	}
	show, err := progressMode(*progress, os.Stderr)
	if err != nil {
		return err
	}
	kv, closeConn, err := openKV(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer closeConn()
	// The whole history, as every reader reads it (schemas.KeyHistory): a cell is its first revision
	// that is a seal, a campaign its first frozen plan and the revisions that legitimately follow; what
	// else a key holds is counted as ignored (tampering).
	meter := newProgressMeter(show, progressOut, "datasets ls: reading revisions", "revisions")
	listing, err := seal.ListProgress(ctx, kv, func(read, total uint64) { meter.Update(read, total, "") })
	meter.Finish()
	if err != nil {
		return err
	}
	return seal.WriteListing(w, listing, *asJSON)
}

// withDatasetKey parses the flags and the one KEY of `datasets <action> KEY`, opens the bucket and
// calls do with it, the key KEY names (seal.KeyArg) and KEY as given (for messages); it closes the
// connection after do.
func withDatasetKey(ctx context.Context, action string, args []string, do func(kv jetstream.KeyValue, key, arg string) error) error {
	fs, conn, scfg := datasetsFlagSet(action, "datasets "+action+" KEY")
	pos, err := datasetsParse(fs, args, 1, "one KEY (cell.<sha256> or campaign.<id>)")
	if err != nil {
		return err
	}
	kv, closeConn, err := openKV(ctx, conn, scfg)
	if err == nil {
		defer closeConn()
		err = do(kv, seal.KeyArg(pos[0]), pos[0])
	}
	return err
}
