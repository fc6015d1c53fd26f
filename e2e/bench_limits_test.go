package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/streams"
)

// The limits of benchmark runs through the real binaries: an artefact over the maximum artefact size
// is refused from its size before it is read (by `bench validate|publish|merge`, exit 2 naming the
// file, its size and the limit; by the merger and the sealer, as an outcome or a dead letter); a
// run_id no subject, object or file name can hold is refused at publish (exit 2 naming the field) and
// rejected by a merger it reaches anyway, once, instead of being retried.

// rusageRun is one finished fpmbus run with its peak resident memory (the kernel's ru_maxrss).
type rusageRun struct {
	out    string
	code   int
	maxRSS int64 // bytes
}

// runRusage runs fpmbus to completion and reports its exit status and peak RSS.
func runRusage(t *testing.T, args ...string) rusageRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fpmbusBin, args...)
	cmd.Env = testEnv(t)
	out, err := cmd.CombinedOutput()
	r := rusageRun{out: string(out)}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fpmbus %v: %v", args, err)
	}
	r.code = cmd.ProcessState.ExitCode()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSS = ru.Maxrss * 1024
	}
	return r
}

// goldenRun copies the golden 4-rank run into a new directory with its run_id replaced by runID (the
// same string in every rank) and returns the rank files.
func goldenRunAs(t *testing.T, runID string) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for _, src := range goldenRanks(t) {
		raw, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		const orig = `"run_id": "3f6a0c1e9b2d4e7f8a5b6c7d8e9f0a1b"`
		if runID != "" {
			if strings.Count(string(raw), orig) != 1 {
				t.Fatalf("%s: the golden run_id occurs %d times", src, strings.Count(string(raw), orig))
			}
			q, _ := json.Marshal(runID)
			raw = []byte(strings.Replace(string(raw), orig, `"run_id": `+string(q), 1))
		}
		dst := filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(dst, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, dst)
	}
	return out
}

// A 1 GiB (sparse) rank artefact is refused by `bench validate`, `bench publish` and `bench merge`
// from its size alone: exit 2, the message names the file, its size and the limit, the process never
// grows anywhere near the file's size (peak RSS, so this test runs alone), and publish stores
// nothing. --max-artefact-size lowers the limit below a real artefact the same way.
func TestBenchArtefactOverTheLimitIsRefusedUnread(t *testing.T) {
	requireNATS(t)
	dir := t.TempDir()
	huge := filepath.Join(dir, "benchmark_results_dp1.json")
	if err := os.WriteFile(huge, []byte(`{"schema_version": 2`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<30); err != nil {
		t.Fatal(err)
	}
	up := startUp(t, 1)
	ranks := goldenRanks(t)
	const rssBound = 128 << 20 // the binary and runtime; reading the file would cost 1 GiB
	for name, args := range map[string][]string{
		"validate": {"bench", "validate", huge},
		"publish":  append([]string{"bench", "publish", "--server", up.url, ranks[0]}, huge),
		"merge":    {"bench", "merge", "--bench-output", filepath.Join(dir, "merged.json"), ranks[0], huge},
	} {
		r := runRusage(t, args...)
		if r.code != 2 {
			t.Fatalf("bench %s of a 1 GiB artefact: exit %d, want 2\n%s", name, r.code, r.out)
		}
		for _, want := range []string{huge, "1073741824 bytes", fmt.Sprintf("the limit is %d bytes", streams.DefaultBenchMaxArtefact), "--max-artefact-size"} {
			if !strings.Contains(r.out, want) {
				t.Fatalf("bench %s: the refusal does not say %q:\n%s", name, want, r.out)
			}
		}
		if r.maxRSS == 0 || r.maxRSS > rssBound {
			t.Fatalf("bench %s peaked at %d bytes RSS refusing the artefact (bound %d): it was read", name, r.maxRSS, rssBound)
		}
		t.Logf("bench %s: refused at %.1f MiB peak RSS", name, float64(r.maxRSS)/(1<<20))
	}
	if _, err := os.Stat(filepath.Join(dir, "merged.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("bench merge wrote a merged artefact: %v", err)
	}

	// A limit below a real artefact: refused the same way; at the default the same file is valid.
	st, err := os.Stat(ranks[0])
	if err != nil {
		t.Fatal(err)
	}
	r := runRusage(t, "bench", "validate", "--max-artefact-size", fmt.Sprint(st.Size()-1), ranks[0])
	if r.code != 2 || !strings.Contains(r.out, fmt.Sprintf("%s is %d bytes", ranks[0], st.Size())) {
		t.Fatalf("bench validate --max-artefact-size %d: exit %d\n%s", st.Size()-1, r.code, r.out)
	}
	if r := runRusage(t, "bench", "validate", "--max-artefact-size", fmt.Sprint(st.Size()), ranks[0]); r.code != 0 {
		t.Fatalf("bench validate at exactly its size: exit %d\n%s", r.code, r.out)
	}
	if n := len(streamsMessages(t, jsClient(t, up.url), streams.StreamBench, ">")); n != 0 {
		t.Fatalf("FPM_BENCH holds %d messages after the refused publications", n)
	}
}

// The merger reads no rank over its --merge-max-artefact-size: the run is rejected with rule
// artefact_size, from the rank's Fpm-Bench-Size header, once; nothing is merged and its ranks are
// acknowledged (not retried).
func TestMergerRejectsARankOverItsLimitUnread(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	out := t.TempDir()
	up := startUp(t, 1, "--merge-bench-output", filepath.Join(out, "merged_{run_id}.json"), "--merge-max-artefact-size", "100000")
	ranks := goldenRanks(t)
	if o, err := run(t, 60*time.Second, fpmbusBin, append([]string{"bench", "publish", "--server", up.url}, ranks...)...); err != nil {
		t.Fatalf("bench publish: %v\n%s", err, o)
	}
	js := jsClient(t, up.url)
	const runID = "3f6a0c1e9b2d4e7f8a5b6c7d8e9f0a1b"
	ev := waitOutcome(t, up.url, runID)
	if ev.Event != merge.EventRejected || ev.Rule != merge.RuleArtefactSize || !strings.Contains(ev.Detail, "the limit is 100000 bytes") {
		t.Fatalf("outcome %+v, want bench_rejected, rule artefact_size naming the limit", ev)
	}
	waitConsumerSettled(t, up.url, streams.StreamBench, merge.DefaultDurable)
	if n := len(streamsMessages(t, js, streams.StreamEvents, streams.BenchOutcomeSubject(runID))); n != 1 {
		t.Fatalf("%d outcomes for the run, want 1", n)
	}
	if m, _ := filepath.Glob(filepath.Join(out, "merged_*")); len(m) != 0 {
		t.Fatalf("merged files written: %v", m)
	}
}

// The sealer reads no merged artefact over its --seal-max-artefact-size: it is dead-lettered with the
// reason, unread, and no cell is sealed.
func TestSealerDeadLettersAMergedArtefactOverItsLimitUnread(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	out := t.TempDir()
	up := startUp(t, 1, "--merge-bench-output", filepath.Join(out, "merged_{run_id}.json"), "--seal-max-artefact-size", "200000")
	profile := filepath.Join(out, "profile.json")
	if err := os.WriteFile(profile, []byte(`{"schema_version":1,"name":"e2e","version":"1","hardware":"H200-SXM"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := run(t, 60*time.Second, fpmbusBin, append([]string{"bench", "publish", "--server", up.url, "--profile", profile}, goldenRanks(t)...)...); err != nil {
		t.Fatalf("bench publish: %v\n%s", err, o)
	}
	js := jsClient(t, up.url)
	waitSubjectCount(t, js, streams.StreamEvents, streams.ConsumerDeadLetterSubject("seal"), 1)
	dl := streamsMessages(t, js, streams.StreamEvents, streams.ConsumerDeadLetterSubject("seal"))[0]
	reason := dl.Headers().Get(streams.HeaderError)
	if !strings.Contains(reason, "larger than the maximum artefact size") || !strings.Contains(reason, "the limit is 200000 bytes") {
		t.Fatalf("dead letter reason %q", reason)
	}
	kv, err := js.KeyValue(t.Context(), streams.BucketDatasets)
	if err == nil {
		if keys, _ := kv.Keys(t.Context()); len(keys) != 0 {
			t.Fatalf("FPM_DATASETS holds %v", keys)
		}
	}
}

// A 300-character run_id: `bench validate` and `bench publish` refuse it (exit 2, naming the field
// and the limit; nothing stored). Published anyway (as an older fpmbus or another client would), the
// merger rejects the run once with rule run_id instead of failing on the file name and retrying
// forever, and acknowledges its ranks.
func TestPoisonRunIDIsRefusedAtPublishAndRejectedByTheMerger(t *testing.T) {
	t.Parallel()
	requireNATS(t)
	out := t.TempDir()
	up := startUp(t, 1, "--merge-bench-output", filepath.Join(out, "merged_{run_id}.json"))
	runID := strings.Repeat("r", 300)
	ranks := goldenRunAs(t, runID)
	for name, args := range map[string][]string{
		"validate": append([]string{"bench", "validate"}, ranks...),
		"publish":  append([]string{"bench", "publish", "--server", up.url}, ranks...),
	} {
		r := runFpmbus(t, nil, args...)
		if r.code != 2 || !strings.Contains(r.out, "rule run_id: field run_id") || !strings.Contains(r.out, "the limit is 128 token bytes") {
			t.Fatalf("bench %s of a 300-character run_id: exit %d\n%s", name, r.code, r.out)
		}
	}
	js := jsClient(t, up.url)
	if n := len(streamsMessages(t, js, streams.StreamBench, ">")); n != 0 {
		t.Fatalf("FPM_BENCH holds %d messages after the refused publish", n)
	}

	store := benchstore.NewBenchStore(js, 0, streams.DefaultConfig())
	for r, f := range ranks {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.PublishRank(t.Context(), benchstore.BenchRankArtefact{RunID: runID, Rank: r, DPSize: 4, File: f}, data); err != nil {
			t.Fatal(err)
		}
	}
	ev := waitOutcome(t, up.url, runID)
	if ev.Event != merge.EventRejected || ev.Rule != merge.RuleRunID || !strings.Contains(ev.Detail, "field run_id") {
		t.Fatalf("outcome %+v, want bench_rejected with rule run_id", ev)
	}
	waitConsumerSettled(t, up.url, streams.StreamBench, merge.DefaultDurable)
	if n := len(streamsMessages(t, js, streams.StreamEvents, streams.BenchOutcomeSubject(runID))); n != 1 {
		t.Fatalf("%d outcomes for the run, want 1", n)
	}
	if m, _ := filepath.Glob(filepath.Join(out, "*")); len(m) != 0 {
		t.Fatalf("files written for the run: %v", m)
	}
}

// waitOutcome waits for run runID's outcome event and decodes it.
func waitOutcome(t *testing.T, url, runID string) merge.Event {
	t.Helper()
	js := jsClient(t, url)
	var ev merge.Event
	eventually(t, 60*time.Second, func() error {
		msgs := streamsMessages(t, js, streams.StreamEvents, streams.BenchOutcomeSubject(runID))
		if len(msgs) == 0 {
			return errors.New("no outcome yet")
		}
		return json.Unmarshal(msgs[0].Data(), &ev)
	})
	return ev
}

// waitConsumerSettled waits until durable consumer name on stream has nothing pending or unacked.
func waitConsumerSettled(t *testing.T, url, stream, name string) {
	t.Helper()
	js := jsClient(t, url)
	eventually(t, 30*time.Second, func() error {
		ci, err := durable.ConsumerInfo(t.Context(), js, stream, name)
		if err != nil {
			return err
		}
		if ci.NumPending != 0 || ci.NumAckPending != 0 {
			return fmt.Errorf("%s.%s: %d pending, %d unacknowledged", stream, name, ci.NumPending, ci.NumAckPending)
		}
		return nil
	})
}
