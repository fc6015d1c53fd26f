package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/streams"
)

func init() {
	register(command{
		name:    "bench",
		summary: "self-benchmark artefacts: publish rank files to FPM_BENCH, merge or validate them offline",
		run:     runBench,
	})
}

const benchUsage = `fpmbus bench publish|merge|validate [flags] FILE...

  publish   validate each rank artefact on its own and publish it to FPM_BENCH (fpmbench.rank.<run>.<rank>);
            --probe FILE publishes worker-probe replies (fpmbench.probe.<run>)
  merge     merge the rank artefacts of one run offline, without a broker: the merged artefact and its
            worker-probe sidecar, written atomically
  validate  check rank artefacts on their own, publishing nothing`

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, benchUsage)
	}
	switch args[0] {
	case "publish":
		return flagUsage(runBenchPublish(ctx, args[1:], os.Stdout))
	case "merge":
		return flagUsage(runBenchMerge(args[1:], os.Stdout))
	case "validate":
		return flagUsage(runBenchValidate(args[1:], os.Stdout))
	case "-h", "--help", "help":
		fmt.Fprintln(os.Stdout, benchUsage)
		return nil
	}
	return fmt.Errorf("%w: fpmbus bench: unknown action %q\n%s", errUsage, args[0], benchUsage)
}

// benchStringList is a repeatable string flag.
type benchStringList []string

func (l *benchStringList) String() string     { return strings.Join(*l, ",") }
func (l *benchStringList) Set(v string) error { *l = append(*l, v); return nil }

func runBenchMerge(args []string, stdout io.Writer) error {
	fs := newFlagSet("bench merge", "bench merge [--bench-output PATH] [--probe FILE]... [--partial-ranks] [--progress MODE] RANK_FILE...")
	output := fs.String("bench-output", environment.Or("FPMBUS_BENCH_OUTPUT", ""),
		"merged artefact path ("+merge.RunIDPlaceholder+" is replaced by the run id); default: Dynamo's <stem>_merged<ext> of the rank-0 file, <stem>_dp<first rank>_merged<ext> when the files start above rank 0 (env FPMBUS_BENCH_OUTPUT)")
	var probes benchStringList
	fs.Var(&probes, "probe", "worker-probe replies (collective_rpc's list, an envelope, or one reply); repeatable")
	partial := fs.Bool("partial-ranks", false, "merge a subset of the run's ranks as Dynamo's node-local merge does (missing ranks get unavailable warmup evidence)")
	parallel := fs.Int("parallel", 0, "rank artefacts read at once (each costs its size in memory); 0: min(CPUs, 4)")
	maxSize := maxArtefactFlag(fs)
	progress := progressFlag(fs)
	files, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("%w: bench merge needs the run's rank artefacts", errUsage)
	}
	show, err := progressMode(*progress, os.Stderr)
	if err != nil {
		return err
	}
	if err := checkMaxArtefact(*maxSize); err != nil {
		return err
	}
	// What is read shows as the merge goes: the rank artefacts, each counted once however often it is
	// loaded (the merge loads several at once, --parallel).
	meter := newProgressMeter(show, progressOut, "bench merge: reading ranks", "bytes")
	run, err := merge.OpenRankFiles(files, *maxSize, func(read, total uint64) { meter.Update(read, total, "") })
	if err != nil {
		return err
	}
	replies, err := merge.ReadProbeReplies(probes, *maxSize)
	if err != nil {
		return err
	}
	out, err := run.MergedPath(*output, *maxSize)
	if err != nil {
		return err
	}
	start := time.Now()
	res, err := merge.Merge(run.Ranks, replies, merge.Options{MergedPath: out, RequireAllRanks: !*partial, Parallelism: *parallel, MaxArtefactSize: *maxSize})
	meter.Finish()
	if err != nil {
		return merge.RankError("", err)
	}
	for _, pr := range replies {
		if pr.RunID != "" && pr.RunID != res.RunID {
			return fmt.Errorf("bench merge: probe replies %s are for run %q, not %q", pr.Source, pr.RunID, res.RunID)
		}
	}
	digest, size, err := merge.WriteResult(res)
	if err != nil {
		return err
	}
	if len(res.CaptureErrors) > 0 {
		slog.Warn("engine provenance capture failed or was absent on some ranks; they are listed in engine.capture_errors",
			"run_id", res.RunID, "capture_errors", res.CaptureErrors)
	}
	res.WriteSummary(stdout, digest, size, time.Since(start))
	return nil
}

func runBenchValidate(args []string, stdout io.Writer) error {
	fs := newFlagSet("bench validate", "bench validate [--max-artefact-size BYTES] RANK_FILE...")
	maxSize := maxArtefactFlag(fs)
	files, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("%w: bench validate needs rank artefacts", errUsage)
	}
	if err := checkMaxArtefact(*maxSize); err != nil {
		return err
	}
	for _, f := range files {
		_, sum, err := merge.ReadRank(f, f, *maxSize)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: valid rank %d of %d, run %s, %d points\n", f, sum.Rank, sum.DPSize, sum.RunID, sum.Points)
	}
	return nil
}

// maxArtefactFlag registers --max-artefact-size.
func maxArtefactFlag(fs *flag.FlagSet) *int64 {
	return fs.Int64("max-artefact-size", streams.DefaultBenchMaxArtefact,
		"largest artefact file (rank artefact, probe replies, collection profile) read, in bytes; a larger one is refused before it is read")
}

func checkMaxArtefact(n int64) error {
	if n < 1 {
		return fmt.Errorf("%w: --max-artefact-size %d must be positive", errUsage, n)
	}
	return nil
}

func runBenchPublish(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("bench publish", "bench publish [--server URL] [--probe FILE [--run-id ID]]... RANK_FILE...")
	conn := connFlags(fs, "bench-publish")
	cfg := streamFlags(fs)
	var probes benchStringList
	fs.Var(&probes, "probe", "worker-probe replies to publish for the run; repeatable")
	runID := fs.String("run-id", "", "run of the --probe replies (default: the replies' own run_id, else the rank files' run)")
	inlineMax := fs.Int("inline-max", benchstore.DefaultBenchInlineMax, "largest body sent inline; larger ones go to the object store "+streams.BenchObjectBucket)
	profile := fs.String("profile", "", "collection profile (JSON) of the run, published on fpmbench.profile.<run> before the ranks so the sealer can derive cell identities")
	maxSize := maxArtefactFlag(fs)
	files, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 && len(probes) == 0 {
		return fmt.Errorf("%w: bench publish needs rank artefacts or --probe files", errUsage)
	}
	if *inlineMax < 1 {
		return fmt.Errorf("%w: --inline-max %d must be positive", errUsage, *inlineMax)
	}
	if err := checkMaxArtefact(*maxSize); err != nil {
		return err
	}
	if *runID != "" {
		if err := streams.CheckRunID(*runID); err != nil {
			return fmt.Errorf("%w: --run-id: %v", errUsage, err)
		}
	}
	// Every rank is checked before anything is published; benchstore.PublishBench reads the files again
	// to publish them (one artefact in memory at a time) and refuses one that changed in between.
	pub, points, err := merge.NewPublication(files, probes, *maxSize)
	if err != nil {
		return err
	}
	probeRun := *runID
	if probeRun == "" && len(pub.Ranks) > 0 {
		probeRun = pub.Ranks[0].RunID
	}
	pub.ProbeRun = func(file string, data []byte) (string, error) {
		run, err := merge.ProbeRun(probeRun, file, data)
		if errors.Is(err, streams.ErrRunID) {
			err = fmt.Errorf("%w: %w", errUsage, err)
		}
		return run, err
	}
	nc, js, err := connectAndApply(ctx, conn, cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	if *profile != "" {
		if len(pub.Ranks) == 0 {
			return fmt.Errorf("%w: --profile needs the run's rank artefacts (their run_id names the run)", errUsage)
		}
		if pub.Profile, err = merge.ReadArtefact(*profile, *maxSize); err != nil {
			return err
		}
	}
	profiled := false
	err = benchstore.NewBenchStore(js, *inlineMax, *cfg).PublishBench(ctx, pub, func(p benchstore.BenchPublished) {
		profiled = profiled || p.Profile
		fmt.Fprintln(stdout, pub.Describe(p, *profile, points))
	})
	if err != nil && pub.Profile != nil && !profiled { // the profile is published first: the error is its
		return fmt.Errorf("--profile %s: %w", *profile, err)
	}
	return err
}
