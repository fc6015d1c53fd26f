package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/consumers/merge"
	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

const (
	goldenRun4 = "../consumers/merge/testdata/golden/protocol_4rank"
	goldenRun  = "3f6a0c1e9b2d4e7f8a5b6c7d8e9f0a1b" // the run_id of the golden fixtures
	failoverP  = 4
)

// startDebug is start with the process logging at debug level: the runner then logs each partition it
// acquires, hands on or loses, which is how the test picks an instance that owns partitions to kill.
func startDebug(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, []string{"FPMBUS_LOG_LEVEL=debug"}, fpmbusBin, args...)
}

var partitionEvent = regexp.MustCompile(`msg="partition (acquired|handed on|lost)".* partition=(\d+)`)

// owned is the set of partitions the process owns by its own log: the last acquired, handed on or lost
// line of each.
func (p *proc) owned() map[int]bool {
	out := map[int]bool{}
	for _, m := range partitionEvent.FindAllStringSubmatch(p.Output(), -1) {
		n, _ := strconv.Atoi(m[2])
		out[n] = m[1] == "acquired"
		if !out[n] {
			delete(out, n)
		}
	}
	return out
}

// owner returns the first of ps (not in skip) that owns a partition. A process's log reaches the test
// a little after the server has acted on it, so it waits for one to say so.
func owner(t *testing.T, ps []*proc, skip ...*proc) *proc {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	next:
		for _, p := range ps {
			for _, s := range skip {
				if s == p {
					continue next
				}
			}
			if len(p.owned()) > 0 {
				return p
			}
		}
	}
	t.Fatal("no instance owns a partition")
	return nil
}

// failoverRuns returns n run ids (at least one per partition of a failoverP group keyed by run) and
// their partition.
func failoverRuns(t *testing.T, prefix string, n int) map[string]int {
	t.Helper()
	g := merge.Config{HoldingConfig: durable.HoldingConfig{Partitions: failoverP}}.Group()
	runs := map[string]int{}
	covered := map[int]bool{}
	for i := 0; len(runs) < n || len(covered) < failoverP; i++ {
		id := prefix + strconv.Itoa(i)
		p, err := g.PartitionOf(streams.BenchRankSubject(id, 0))
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) >= n && covered[p] {
			continue
		}
		runs[id], covered[p] = p, true
	}
	return runs
}

// partitionState waits until every partition consumer of group on FPM_BENCH_PART_<group> has nothing
// pending and want(p) messages unacknowledged.
func waitPartitionState(t *testing.T, js jetstream.JetStream, group string, what string, d time.Duration, want func(p int) int) {
	t.Helper()
	eventually(t, d, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream := streams.StreamBench + "_PART_" + group
		for p := range failoverP {
			c, err := js.PushConsumer(ctx, stream, group+"-"+strconv.Itoa(p))
			if err != nil {
				return err
			}
			if ci := c.CachedInfo(); ci.NumPending != 0 || ci.NumAckPending != want(p) {
				return fmt.Errorf("%s: partition %d: %d pending, %d unacked, want 0 and %d", what, p, ci.NumPending, ci.NumAckPending, want(p))
			}
		}
		return nil
	})
}

func perPartition(runs map[string]int, p int, per int) int {
	n := 0
	for _, q := range runs {
		if q == p {
			n += per
		}
	}
	return n
}

// Three `fpmbus merge` processes of one group (4 partitions keyed by run_id) while several runs arrive
// rank by rank: one is SIGKILLed while every run has two of its four ranks held, one is stopped with
// SIGTERM while they have three. Every run is merged exactly once: one merged artefact file and one
// sidecar across the three processes' output directories, one fpmbench.merged.<run> message, one
// outcome event; every rank message is acknowledged, none dead-lettered.
func TestBenchMergeFailoverThreeProcessesOneKilledOneStopped(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	work := t.TempDir()
	runs := failoverRuns(t, "failover-merge-", 6)
	// Each run's four rank files: the golden run with its run_id replaced.
	rankFiles := map[int][]string{} // rank -> files of every run
	for run := range runs {
		dir := filepath.Join(work, "ranks", run)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for rank, name := range []string{"benchmark_results.json", "benchmark_results_dp1.json", "benchmark_results_dp2.json", "benchmark_results_dp3.json"} {
			b, err := os.ReadFile(filepath.Join(goldenRun4, name))
			if err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(dir, name)
			if err := os.WriteFile(f, bytes.ReplaceAll(b, []byte(goldenRun), []byte(run)), 0o644); err != nil {
				t.Fatal(err)
			}
			rankFiles[rank] = append(rankFiles[rank], f)
		}
	}
	publish := func(rank int) {
		t.Helper()
		args := append([]string{"bench", "publish", "--server", url}, rankFiles[rank]...)
		if o, err := run(t, 30*time.Second, fpmbusBin, args...); err != nil {
			t.Fatalf("bench publish rank %d: %v\n%s", rank, err, o)
		}
	}

	var ps []*proc
	for i := range 3 {
		out := filepath.Join(work, "out"+strconv.Itoa(i))
		ps = append(ps, startDebug(t, "fpmbus merge "+strconv.Itoa(i), "merge", "--server", url,
			"--merge-partitions", strconv.Itoa(failoverP), "--merge-pinned-ttl", "3s", "--merge-member-id", "m"+strconv.Itoa(i),
			"--bench-output", filepath.Join(out, "merged_{run_id}.json"), "--spool-dir", filepath.Join(work, "spool"+strconv.Itoa(i))))
	}
	for _, p := range ps {
		p.waitOutput("consumer running", 20*time.Second)
	}
	time.Sleep(time.Second) // the members see each other

	publish(0)
	publish(1)
	group := merge.DefaultDurable
	waitPartitionState(t, env.JS, group, "ranks 0 and 1 held", 20*time.Second, func(p int) int { return perPartition(runs, p, 2) })
	killed := owner(t, ps)
	t.Logf("SIGKILL %s (owns %v)", killed.name, killed.owned())
	_ = killed.signal(syscall.SIGKILL, 10*time.Second)
	publish(2)
	// The killed instance's partitions are taken over after the pinned TTL: its ranks come again.
	waitPartitionState(t, env.JS, group, "ranks 0 to 2 held", 30*time.Second, func(p int) int { return perPartition(runs, p, 3) })
	stopped := owner(t, ps, killed)
	t.Logf("SIGTERM %s (owns %v)", stopped.name, stopped.owned())
	if err := stopped.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("%s after SIGTERM: %v", stopped.name, err)
	}
	publish(3)

	eventually(t, 40*time.Second, func() error {
		for run := range runs {
			if n := len(natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.BenchOutcomeSubject(run))); n != 1 {
				return fmt.Errorf("run %s: %d outcome events", run, n)
			}
		}
		return nil
	})
	waitPartitionState(t, env.JS, group, "every rank acknowledged", 10*time.Second, func(int) int { return 0 })
	for _, p := range ps {
		if p != killed && p != stopped {
			if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Fatalf("%s after SIGTERM: %v", p.name, err)
			}
		}
	}

	for run := range runs {
		enc := streams.EncodeToken(run)
		merged, _ := filepath.Glob(filepath.Join(work, "out*", "merged_"+enc+".json"))
		sidecars, _ := filepath.Glob(filepath.Join(work, "out*", "merged_"+enc+"_worker_probe.json"))
		if len(merged) != 1 || len(sidecars) != 1 {
			t.Fatalf("run %s: merged files %v, sidecars %v: want one of each", run, merged, sidecars)
		}
		var doc struct {
			ArtifactType string `json:"artifact_type"`
			RunID        string `json:"run_id"`
		}
		if b, err := os.ReadFile(merged[0]); err != nil || json.Unmarshal(b, &doc) != nil || doc.RunID != run || doc.ArtifactType != "merged" {
			t.Fatalf("merged artefact %s: %v %+v", merged[0], err, doc)
		}
		if n := len(natsservertest.Messages(t, env.JS, streams.StreamBench, streams.BenchMergedSubject(run))); n != 1 {
			t.Fatalf("run %s: %d merged messages", run, n)
		}
		ev := natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.BenchOutcomeSubject(run))
		if len(ev) != 1 || ev[0].Headers().Get(streams.HeaderEventType) != merge.EventMerged {
			t.Fatalf("run %s: outcome events %d (%v)", run, len(ev), ev)
		}
	}
	if dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(merge.ConsumerName)); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
}

// Three `fpmbus seal` processes of one group (4 partitions keyed by run) while merged artefacts wait
// for their runs' collection profiles: one is SIGKILLed while every artefact is held, one stopped with
// SIGTERM while half of them are. Every run's cell is sealed exactly once (KV revision history of
// length 1), every merged message is acknowledged, none dead-lettered.
func TestBenchSealFailoverThreeProcessesOneKilledOneStopped(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	ctx := context.Background()
	runs := failoverRuns(t, "failover-seal-", 6)
	golden, err := os.ReadFile(filepath.Join(goldenRun4, "merged.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ps []*proc
	for i := range 3 {
		ps = append(ps, startDebug(t, "fpmbus seal "+strconv.Itoa(i), "seal", "--server", url,
			"--seal-partitions", strconv.Itoa(failoverP), "--seal-pinned-ttl", "3s", "--seal-member-id", "s"+strconv.Itoa(i)))
	}
	for _, p := range ps {
		p.waitOutput("consumer running", 20*time.Second)
	}
	time.Sleep(time.Second)

	// Every run's merged artefact, before its profile: each run gets its own profile name, so its
	// own cell.
	var order []string
	for run := range runs {
		order = append(order, run)
		doc := bytes.ReplaceAll(golden, []byte(goldenRun), []byte(run))
		msg := nats.NewMsg(streams.BenchMergedSubject(run))
		msg.Data = doc
		msg.Header.Set(streams.HeaderBenchKind, streams.BenchKindMerged)
		msg.Header.Set(streams.HeaderBenchRun, run)
		msg.Header.Set(streams.HeaderBenchSHA256, schemas.SHA256Hex(doc))
		msg.Header.Set(streams.HeaderBenchSize, strconv.Itoa(len(doc)))
		if _, err := env.JS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	publishProfile := func(run string) {
		t.Helper()
		body := fmt.Sprintf(`{"schema_version":1,"name":"e2e-%s","version":"1","hardware":"H200-SXM","settings":{"clocks":"locked"}}`, run)
		if _, err := benchstore.PublishProfile(ctx, env.JS, run, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	group := seal.DefaultDurable
	waitPartitionState(t, env.JS, group, "every artefact held", 20*time.Second, func(p int) int { return perPartition(runs, p, 1) })

	killed := owner(t, ps)
	t.Logf("SIGKILL %s (owns %v)", killed.name, killed.owned())
	_ = killed.signal(syscall.SIGKILL, 10*time.Second)
	half := map[string]bool{}
	for _, run := range order[:len(order)/2] {
		half[run] = true
		publishProfile(run)
	}
	// The killed instance's partitions are taken over after the pinned TTL; the runs with a profile
	// are sealed, the others held.
	waitPartitionState(t, env.JS, group, "half sealed, half held", 30*time.Second, func(p int) int {
		n := 0
		for run, q := range runs {
			if q == p && !half[run] {
				n++
			}
		}
		return n
	})
	stopped := owner(t, ps, killed)
	t.Logf("SIGTERM %s (owns %v)", stopped.name, stopped.owned())
	if err := stopped.signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("%s after SIGTERM: %v", stopped.name, err)
	}
	for _, run := range order[len(order)/2:] {
		publishProfile(run)
	}
	waitPartitionState(t, env.JS, group, "every artefact sealed", 30*time.Second, func(int) int { return 0 })
	for _, p := range ps {
		if p != killed && p != stopped {
			if err := p.signal(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Fatalf("%s after SIGTERM: %v", p.name, err)
			}
		}
	}

	kv, err := env.JS.KeyValue(ctx, streams.BucketDatasets)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cells := map[string]string{} // run -> cell key
	for k := range lister.Keys() {
		if !strings.HasPrefix(k, "cell.") {
			continue
		}
		h, err := kv.History(ctx, k)
		if err != nil || len(h) != 1 || h[0].Revision() == 0 {
			t.Fatalf("%s: history %d (%v), want one revision", k, len(h), err)
		}
		var v schemas.SealedCell
		if err := json.Unmarshal(h[0].Value(), &v); err != nil {
			t.Fatal(err)
		}
		if prev, dup := cells[v.Provenance.RunID]; dup {
			t.Fatalf("run %s sealed twice: %s and %s", v.Provenance.RunID, prev, k)
		}
		cells[v.Provenance.RunID] = k
	}
	for run := range runs {
		if cells[run] == "" {
			t.Fatalf("run %s not sealed (cells %v)", run, cells)
		}
	}
	if len(cells) != len(runs) {
		t.Fatalf("%d cells for %d runs", len(cells), len(runs))
	}
	if dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(seal.ConsumerName)); len(dl) != 0 {
		t.Fatalf("%d dead letters", len(dl))
	}
}
