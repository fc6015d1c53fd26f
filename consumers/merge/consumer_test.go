package merge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

func TestMain(m *testing.M) {
	// nats.go v1.55.0's ObjectStore.Put makes a JetStream context per call and removes its status
	// listener on return; when a small Put returns before the listener goroutine started by the first
	// async publish has read its channel, that goroutine reads nil and blocks forever
	// (jetstream/object.go Put -> cleanupReplySub vs publish.go resetPendingAcksOnReconnect). It is
	// nats.go's, one per affected Put, and not something this package can stop.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

// running is a consumer under test with the events it published.
type running struct {
	c      *Consumer
	events chan Event
	errc   chan error
	cancel context.CancelFunc
}

func startConsumer(t *testing.T, env *natsservertest.Env, cfg Config, opts ...durable.Option) *running {
	t.Helper()
	r := &running{events: make(chan Event, 64), errc: make(chan error, 1)}
	if cfg.Output == "" {
		cfg.Output = filepath.Join(t.TempDir(), "benchmark_results_"+RunIDPlaceholder+"_merged.json")
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = t.TempDir()
	}
	if cfg.PinnedTTL == 0 {
		cfg.PinnedTTL = durable.MinPinnedTTL
	}
	cfg.InlineMax = 4096
	cfg.EventHook = func(ev Event) { r.events <- ev }
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	c, err := New(cfg, env.JS, opts...)
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.errc <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	select {
	case <-c.Ready():
	case err := <-r.errc:
		t.Fatalf("merger ended before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("merger not ready")
	}
	return r
}

// stop stops the consumer gracefully and waits for Run (idempotent).
func (r *running) stop(t *testing.T) {
	r.cancel()
	select {
	case err := <-r.errc:
		if err != nil {
			t.Errorf("run: %v", err)
		}
		r.errc <- nil
	case <-time.After(30 * time.Second):
		t.Errorf("merger did not stop")
	}
}

func (r *running) next(t *testing.T, want string) Event {
	t.Helper()
	for {
		select {
		case ev := <-r.events:
			if want == "" || ev.Event == want {
				return ev
			}
			t.Logf("event %s (waiting for %s): %+v", ev.Event, want, ev)
		case <-time.After(20 * time.Second):
			t.Fatalf("no %s event", want)
		}
	}
}

func (r *running) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case ev := <-r.events:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(d):
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func count(t *testing.T, env *natsservertest.Env, stream, subject string) int {
	t.Helper()
	return len(natsservertest.Messages(t, env.JS, stream, subject))
}

// publishRaw re-publishes a rank with a fresh message id, as a re-publication after the duplicate window
// would arrive: the message the store published for these bytes (same headers, inline body or object),
// stored again under msgID.
func publishRaw(t *testing.T, env *natsservertest.Env, file string, data []byte, msgID string) {
	t.Helper()
	ctx := context.Background()
	sum, err := validateRank(RankFile{Rank: rankFromPath(file), Path: file, Data: data}, 0)
	if err != nil {
		t.Fatal(err)
	}
	bench, err := env.JS.Stream(ctx, streams.StreamBench)
	if err != nil {
		t.Fatal(err)
	}
	first, err := bench.GetLastMsgForSubject(ctx, streams.BenchRankSubject(sum.RunID, sum.Rank))
	if err != nil {
		t.Fatal(err)
	}
	if first.Header.Get(streams.HeaderBenchSHA256) != schemas.SHA256Hex(data) {
		t.Fatalf("the last publication of rank %d holds other bytes", sum.Rank)
	}
	msg := &nats.Msg{Subject: first.Subject, Header: nats.Header{}, Data: first.Data}
	for k, v := range first.Header {
		msg.Header[k] = v
	}
	msg.Header.Set(streams.HeaderMsgID, msgID)
	if _, err := env.JS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
}

// publishRank validates a rank artefact and publishes it, as `fpmbus bench publish` does.
func publishRank(ctx context.Context, store *benchstore.BenchStore, file string, data []byte) (RankSummary, *jetstream.PubAck, error) {
	sum, err := validateRank(RankFile{Rank: rankFromPath(file), Path: file, Data: data}, 0)
	if err != nil {
		return RankSummary{}, nil, err
	}
	ack, err := store.PublishRank(ctx, benchstore.BenchRankArtefact{RunID: sum.RunID, Rank: sum.Rank, DPSize: sum.DPSize, File: file}, data)
	return sum, ack, err
}

// publishProbe checks worker-probe replies and publishes them, as `fpmbus bench publish --probe` does.
func publishProbe(ctx context.Context, store *benchstore.BenchStore, runID, file string, data []byte) (*jetstream.PubAck, string, error) {
	run, err := ProbeRun(runID, file, data)
	if err != nil {
		return nil, "", err
	}
	ack, err := store.PublishProbe(ctx, run, file, data)
	return ack, run, err
}

func TestBenchBrokerOutOfOrderAndRepublished(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	store := benchstore.NewBenchStore(env.JS, 4096, streams.DefaultConfig()) // 60 KB rank files go through the object store
	ranks, _ := loadGoldenInputs(t, goldenDir("protocol_4rank"))
	probeData, err := os.ReadFile(filepath.Join(goldenDir("protocol_4rank"), "probe.json"))
	if err != nil {
		t.Fatal(err)
	}
	runID := goldenCases[1].spec.runID
	out := filepath.Join(t.TempDir(), "benchmark_results_"+RunIDPlaceholder+"_merged.json")

	r := startConsumer(t, env, Config{Output: out})
	if _, _, err := publishProbe(ctx, store, runID, "/tmp/probe.json", probeData); err != nil {
		t.Fatal(err)
	}
	byRank := map[int]RankFile{}
	for _, rf := range ranks {
		byRank[rankFromPath(rf.Path)] = rf
		if rankFromPath(rf.Path) < 0 {
			byRank[0] = rf
		}
	}
	for _, rank := range []int{2, 0, 3} {
		if _, _, err := publishRank(ctx, store, byRank[rank].Path, byRank[rank].Data); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 0 again: the server deduplicates the identical re-publication inside its window...
	if _, ack, err := publishRank(ctx, store, byRank[0].Path, byRank[0].Data); err != nil || !ack.Duplicate {
		t.Fatalf("identical re-publication: ack %+v err %v, want a duplicate", ack, err)
	}
	// ...and the merger recognises one arriving after the window (a new message id, the same bytes).
	publishRaw(t, env, byRank[0].Path, byRank[0].Data, "after-the-window-1")
	r.quiet(t, 300*time.Millisecond) // three of four ranks: nothing happens yet
	if _, _, err := publishRank(ctx, store, byRank[1].Path, byRank[1].Data); err != nil {
		t.Fatal(err)
	}
	ev := r.next(t, EventMerged)
	if ev.RunID != runID || len(ev.SourceRanks) != 4 || ev.Points != 4 {
		t.Fatalf("merged event %+v", ev)
	}

	// The broker merge equals the offline merge of the same files.
	mergedPath := expandPath(out, runID)
	want, err := Merge(ranks, mustProbes(t, probeData), Options{MergedPath: mergedPath, RequireAllRanks: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(mergedPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, schemas.AppendBenchJSON(nil, want.Merged)) {
		t.Fatalf("broker merge differs from the offline merge")
	}
	if ev.MergedSHA256 != schemas.SHA256Hex(got) {
		t.Fatalf("event digest %s, file %s", ev.MergedSHA256, schemas.SHA256Hex(got))
	}
	side, err := os.ReadFile(sidecarPathFor(mergedPath))
	if err != nil || !bytes.Equal(side, schemas.AppendBenchJSON(nil, want.Sidecar)) {
		t.Fatalf("sidecar differs from the offline one (%v)", err)
	}
	msgs := natsservertest.Messages(t, env.JS, streams.StreamBench, streams.BenchMergedSubject(runID))
	if len(msgs) != 1 || msgs[0].Headers().Get(streams.HeaderBenchObject) == "" {
		t.Fatalf("%d merged messages (want 1, body in the object store)", len(msgs))
	}
	body, err := store.Fetch(ctx, msgs[0].Headers(), msgs[0].Data())
	if err != nil || !bytes.Equal(body, got) {
		t.Fatalf("the published merged artefact differs from the file (%v)", err)
	}
	if n := count(t, env, streams.StreamBench, streams.BenchSidecarSubject(runID)); n != 1 {
		t.Fatalf("%d sidecar messages", n)
	}

	// A conflicting re-publication of rank 1 is reported; the merged artefact stands.
	docs := goldenCases[1].spec.build()
	docs[1].Set("benchmark_config", obj("mode", "graph_aware", "content_mode", "synthetic", "pool_tag", "other"))
	if _, _, err := publishRank(ctx, store, byRank[1].Path, schemas.AppendBenchJSON(nil, &docs[1])); err != nil {
		t.Fatal(err)
	}
	cev := r.next(t, eventConflict)
	if cev.Rank == nil || *cev.Rank != 1 || cev.KeptSHA256 != schemas.SHA256Hex(byRank[1].Data) {
		t.Fatalf("conflict event %+v", cev)
	}

	// After a restart the durable replays nothing merged twice: an identical re-publication is silent.
	r.stop(t)
	r2 := startConsumer(t, env, Config{Output: out})
	publishRaw(t, env, byRank[2].Path, byRank[2].Data, "after-the-window-2")
	r2.quiet(t, 500*time.Millisecond)
	if n := count(t, env, streams.StreamBench, streams.BenchMergedSubject(runID)); n != 1 {
		t.Fatalf("%d merged messages after the restart", n)
	}
	if n := count(t, env, streams.StreamEvents, streams.BenchOutcomeSubject(runID)); n != 1 {
		t.Fatalf("%d outcome events", n)
	}
	after, _ := os.ReadFile(mergedPath)
	if !bytes.Equal(after, got) {
		t.Fatalf("the merged file changed")
	}
}

func mustProbes(t *testing.T, data []byte) []ProbeReplies {
	t.Helper()
	p, err := parseProbeReplies(data, "probe.json")
	if err != nil {
		t.Fatal(err)
	}
	return []ProbeReplies{p}
}

func TestBenchBrokerRejectsOnceAndWritesNothing(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	store := benchstore.NewBenchStore(env.JS, 0, streams.DefaultConfig())
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	r := startConsumer(t, env, Config{Output: filepath.Join(dir, "m_"+RunIDPlaceholder+".json"), Registerer: reg})
	docs := ruleBase.build()
	setPath(&docs[1], v("FLASHINFER"), "engine", "attention", "backend_requested")
	files := defaultFiles(docs)
	for _, rf := range files {
		if _, _, err := publishRank(ctx, store, rf.Path, rf.Data); err != nil {
			t.Fatal(err)
		}
	}
	ev := r.next(t, EventRejected)
	if ev.RunID != ruleBase.runID || ev.Rank == nil || *ev.Rank != 1 || ev.Rule != ruleEngineMismatch || ev.Detail == "" {
		t.Fatalf("rejection event %+v", ev)
	}
	publishRaw(t, env, files[1].Path, files[1].Data, "again")
	r.quiet(t, 300*time.Millisecond)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a rejected merge wrote %d files", len(entries))
	}
	if n := count(t, env, streams.StreamBench, streams.BenchMergedSubject(ruleBase.runID)); n != 0 {
		t.Fatalf("%d merged messages for a rejected run", n)
	}
	msgs := natsservertest.Messages(t, env.JS, streams.StreamEvents, streams.BenchOutcomeSubject(ruleBase.runID))
	if len(msgs) != 1 || msgs[0].Headers().Get(streams.HeaderEventType) != EventRejected {
		t.Fatalf("%d outcome events", len(msgs))
	}
	var body Event
	if err := json.Unmarshal(msgs[0].Data(), &body); err != nil || body.Rule != ruleEngineMismatch {
		t.Fatalf("event body %s (%v)", msgs[0].Data(), err)
	}
	if got := runsByOutcome(t, reg); got[EventRejected] != 1 || got[EventMerged] != 0 || len(got) != 4 {
		t.Fatalf("fpmbus_merge_runs_total: %v, want one bench_rejected", got)
	}
}

// runsByOutcome reads fpmbus_merge_runs_total from reg.
func runsByOutcome(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "fpmbus_merge_runs_total" {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestBenchBrokerReportsIncompleteRun(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	store := benchstore.NewBenchStore(env.JS, 0, streams.DefaultConfig())
	r := startConsumer(t, env, Config{RankTimeout: 700 * time.Millisecond})
	spec := runSpec{runID: "incomplete-run", grid: "g", size: 4, points: 2}
	files := spec.rankFiles()
	for _, i := range []int{0, 2} {
		if _, _, err := publishRank(ctx, store, files[i].Path, files[i].Data); err != nil {
			t.Fatal(err)
		}
	}
	ev := r.next(t, eventIncomplete)
	if ev.RunID != spec.runID || ev.DPSize != 4 || !equalInts(ev.MissingRanks, []int{1, 3}) || !equalInts(ev.PresentRanks, []int{0, 2}) {
		t.Fatalf("incomplete event %+v", ev)
	}
	// A rank arriving late does not revive the run.
	if _, _, err := publishRank(ctx, store, files[1].Path, files[1].Data); err != nil {
		t.Fatal(err)
	}
	r.quiet(t, 300*time.Millisecond)
}

func TestBenchBrokerLateProbeRewritesSidecar(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	store := benchstore.NewBenchStore(env.JS, 0, streams.DefaultConfig())
	out := filepath.Join(t.TempDir(), "r_"+RunIDPlaceholder+"_merged.json")
	r := startConsumer(t, env, Config{Output: out})
	spec := runSpec{runID: "late-probe", grid: "g", size: 2, points: 2, raw: 2, protocol: true, exec: true, engine: true}
	for _, rf := range spec.rankFiles() {
		if _, _, err := publishRank(ctx, store, rf.Path, rf.Data); err != nil {
			t.Fatal(err)
		}
	}
	ev := r.next(t, EventMerged)
	side := readSidecar(t, ev.SidecarPath)
	if side.Merged.Resolution != NoRepliesReason {
		t.Fatalf("sidecar without replies: resolution %q", side.Merged.Resolution)
	}
	merged, _ := os.ReadFile(ev.MergedPath)
	replies := v([]any{workerReply(0, 0, 0, 0, 0, mla(""), layers), workerReply(1, 0, 0, 0, 0, mla(""), layers)})
	if _, _, err := publishProbe(ctx, store, spec.runID, "/tmp/probe.json", schemas.AppendBenchJSON(nil, &replies)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for readSidecar(t, ev.SidecarPath).Merged.Resolution != schemas.ResolutionProbe {
		if time.Now().After(deadline) {
			t.Fatalf("sidecar not rewritten: %q", readSidecar(t, ev.SidecarPath).Merged.Resolution)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if after, _ := os.ReadFile(ev.MergedPath); !bytes.Equal(after, merged) {
		t.Fatalf("a late probe reply changed the merged artefact")
	}
}

func readSidecar(t *testing.T, path string) schemas.WorkerProbeSidecar {
	t.Helper()
	var s schemas.WorkerProbeSidecar
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Two instances of one group with two partitions: each owns one partition, and every run is merged
// exactly once, by the owner of its partition.
func TestBenchBrokerTwoPartitions(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	store := benchstore.NewBenchStore(env.JS, 0, streams.DefaultConfig())
	dir := t.TempDir()
	p0 := startConsumer(t, env, Config{HoldingConfig: durable.HoldingConfig{Partitions: 2}, Output: filepath.Join(dir, "p0_"+RunIDPlaceholder+".json")}, durable.WithMemberID("m0"))
	p1 := startConsumer(t, env, Config{HoldingConfig: durable.HoldingConfig{Partitions: 2}, Output: filepath.Join(dir, "p1_"+RunIDPlaceholder+".json")}, durable.WithMemberID("m1"))
	// A partition gets an owner once it has a message: probe replies of a run in each partition
	// (done at once, the run being open) make the group settle before the runs are published.
	group := p0.c.Group()
	probeData, err := os.ReadFile(filepath.Join(goldenDir("protocol_4rank"), "probe.json"))
	if err != nil {
		t.Fatal(err)
	}
	for i, warm := 0, map[int]bool{}; len(warm) < 2; i++ {
		run := "warm-up-" + strconv.Itoa(i)
		if p, _ := group.PartitionOf(streams.BenchProbeSubject(run)); !warm[p] {
			warm[p] = true
			if _, err := store.PublishProbe(ctx, run, "/tmp/probe.json", probeData); err != nil {
				t.Fatal(err)
			}
		}
	}
	var own0, own1 []int
	waitFor(t, "each instance owns one partition", 20*time.Second, func() bool {
		own0, own1 = p0.c.Owned(), p1.c.Owned()
		return len(own0) == 1 && len(own1) == 1 && own0[0] != own1[0]
	})
	insts := map[int]*running{own0[0]: p0, own1[0]: p1}
	owners := map[string]int{}
	for i := range 8 {
		spec := runSpec{runID: "scale-run-" + strconv.Itoa(i), grid: "g", size: 2, points: 2}
		p, err := group.PartitionOf(streams.BenchRankSubject(spec.runID, 0))
		if err != nil {
			t.Fatal(err)
		}
		if pp, _ := group.PartitionOf(streams.BenchProbeSubject(spec.runID)); pp != p {
			t.Fatalf("run %s: ranks in partition %d, probe replies in %d", spec.runID, p, pp)
		}
		owners[spec.runID] = p
		for _, rf := range spec.rankFiles() {
			if _, _, err := publishRank(ctx, store, rf.Path, rf.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(owners) != 8 {
		t.Fatal("duplicate run ids")
	}
	seen := map[string]bool{}
	for _, want := range []int{0, 1} {
		inst := insts[want]
		n := 0
		for _, o := range owners {
			if o == want {
				n++
			}
		}
		for range n {
			ev := inst.next(t, EventMerged)
			if owners[ev.RunID] != want || seen[ev.RunID] || ev.ConsumerPartition != strconv.Itoa(want)+"/2" {
				t.Fatalf("partition %d merged %s (owner %d, seen %v, event partition %q)", want, ev.RunID, owners[ev.RunID], seen[ev.RunID], ev.ConsumerPartition)
			}
			seen[ev.RunID] = true
		}
	}
	p0.quiet(t, 200*time.Millisecond)
	p1.quiet(t, 50*time.Millisecond)
	for id := range owners {
		if n := count(t, env, streams.StreamBench, streams.BenchMergedSubject(id)); n != 1 {
			t.Fatalf("run %s merged %d times", id, n)
		}
	}
	for _, h := range []durable.HoldingConfig{{Partitions: -1}, {Partitions: durable.MaxPartitions + 1}, {PinnedTTL: time.Millisecond}, {Durable: "a.b"}} {
		cfg := Config{HoldingConfig: h}
		if _, err := New(cfg, env.JS); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("config %+v accepted: %v", cfg, err)
		}
	}
	if _, err := New(Config{}, env.JS, durable.WithClock(nil)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil clock accepted: %v", err)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A graceful stop in the middle of a run hands its ranks back; the next instance of the partition
// merges the run when the remaining ranks arrive.
func TestBenchBrokerResumesAfterRestart(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx := context.Background()
	store := benchstore.NewBenchStore(env.JS, 0, streams.DefaultConfig())
	out := filepath.Join(t.TempDir(), "r_"+RunIDPlaceholder+"_merged.json")
	spec := runSpec{runID: "restart-run", grid: "g", size: 4, points: 2, raw: 2, protocol: true, exec: true, engine: true}
	files := spec.rankFiles()
	a := startConsumer(t, env, Config{Output: out})
	for _, rf := range files[:2] {
		if _, _, err := publishRank(ctx, store, rf.Path, rf.Data); err != nil {
			t.Fatal(err)
		}
	}
	a.quiet(t, 300*time.Millisecond)
	// The held ranks are not acknowledged before their run's outcome is durable.
	if cons, err := env.JS.PushConsumer(ctx, streams.StreamBench, DefaultDurable); err != nil {
		t.Fatal(err)
	} else if ci, err := cons.Info(ctx); err != nil || ci.NumAckPending != 2 || ci.AckFloor.Stream != 0 {
		t.Fatalf("while the run is incomplete: %+v %v (want 2 unacked, nothing acked)", ci, err)
	}
	a.stop(t)
	b := startConsumer(t, env, Config{Output: out})
	for _, rf := range files[2:] {
		if _, _, err := publishRank(ctx, store, rf.Path, rf.Data); err != nil {
			t.Fatal(err)
		}
	}
	ev := b.next(t, EventMerged)
	if !equalInts(ev.SourceRanks, []int{0, 1, 2, 3}) {
		t.Fatalf("merged ranks %v", ev.SourceRanks)
	}
	if n := count(t, env, streams.StreamBench, streams.BenchMergedSubject(spec.runID)); n != 1 {
		t.Fatalf("%d merged messages", n)
	}
}

// A message that can never be merged never loops: one that is not a rank artefact publication is
// dead-lettered at once (consumer, subject, stream sequence, reason), and a rank artefact whose body
// breaks a merge rule gets its run's one bench_rejected outcome. Either way it is acknowledged and
// never delivered again.
func TestBenchBrokerPoisonRanks(t *testing.T) {
	t.Parallel()
	garbage := []byte("garbage")
	for name, tc := range map[string]struct {
		subject     string
		headers     map[string]string
		deadLetter  bool
		outcomeRule rule
	}{
		"nats pub of garbage on a rank subject": {subject: streams.BenchRankSubject("run4", 0), deadLetter: true},
		"rank token that is not a rank":         {subject: streams.BenchRankRoot + ".run4.x", deadLetter: true},
		"digest header that is not a sha256": {subject: streams.BenchRankSubject("run4", 0), deadLetter: true,
			headers: map[string]string{streams.HeaderBenchSHA256: "nope", streams.HeaderBenchDPSize: "1"}},
		"garbage body with the publish protocol's headers": {subject: streams.BenchRankSubject("run4", 0), outcomeRule: RuleMalformedJSON,
			headers: map[string]string{streams.HeaderBenchKind: streams.BenchKindRank, streams.HeaderBenchRun: "run4",
				streams.HeaderBenchRank: "0", streams.HeaderBenchDPSize: "1", streams.HeaderBenchSHA256: schemas.SHA256Hex(garbage),
				streams.HeaderBenchSize: strconv.Itoa(len(garbage))}},
	} {
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			ctx := context.Background()
			dir := t.TempDir()
			r := startConsumer(t, env, Config{Output: filepath.Join(dir, "m_"+RunIDPlaceholder+".json")})
			msg := nats.NewMsg(tc.subject)
			msg.Data = garbage
			for k, v := range tc.headers {
				msg.Header.Set(k, v)
			}
			ack, err := env.JS.PublishMsg(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			cons, err := env.JS.PushConsumer(ctx, streams.StreamBench, DefaultDurable)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the message acknowledged", 10*time.Second, func() bool {
				ci, err := cons.Info(ctx)
				return err == nil && ci.AckFloor.Stream == ack.Sequence && ci.NumAckPending == 0
			})
			if tc.outcomeRule != "" {
				ev := r.next(t, EventRejected)
				if ev.RunID != "run4" || ev.Rule != tc.outcomeRule {
					t.Fatalf("rejection event %+v", ev)
				}
			}
			time.Sleep(time.Second) // a redelivery would come now: none may
			r.quiet(t, 100*time.Millisecond)
			dl := natsservertest.Messages(t, env.JS, streams.StreamEvents, durable.RejectedSubject(ConsumerName))
			if !tc.deadLetter {
				if len(dl) != 0 {
					t.Fatalf("%d dead letters for a run rejected by a merge rule", len(dl))
				}
				if n := count(t, env, streams.StreamEvents, streams.BenchOutcomeSubject("run4")); n != 1 {
					t.Fatalf("%d outcome events", n)
				}
			} else {
				if len(dl) != 1 {
					t.Fatalf("%d dead letters, want 1", len(dl))
				}
				h := dl[0].Headers()
				if string(dl[0].Data()) != string(garbage) || h.Get(streams.HeaderConsumer) != ConsumerName ||
					h.Get(streams.HeaderSubject) != tc.subject || h.Get(streams.HeaderStream) != streams.StreamBench ||
					h.Get(streams.HeaderStreamSeq) != strconv.FormatUint(ack.Sequence, 10) || h.Get(streams.HeaderError) == "" {
					t.Fatalf("dead letter %q headers %v", dl[0].Data(), h)
				}
				if n := count(t, env, streams.StreamEvents, streams.BenchOutcomeSubject("run4")); n != 0 {
					t.Fatalf("%d outcome events for a message that is not a rank artefact", n)
				}
			}
			if ci, err := cons.Info(ctx); err != nil || ci.NumRedelivered != 0 || ci.Delivered.Consumer != 1 {
				t.Fatalf("consumer after the poison message: %+v %v (want one delivery)", ci, err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("a poison message wrote %d files", len(entries))
			}
		})
	}
}

// lockedLog collects what a consumer logs from its own goroutine.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// The spool's default is under /tmp, where anyone may plant a symbolic link under the name of the
// spool directory or of a run's directory in it: the merger writes no rank body through it, says
// which path it refuses, and leaves the link as it is; once the link is gone the run merges, in a
// spool directory that is the merger's alone, removed after the merge.
func TestBenchBrokerSpoolRefusesAPlantedLink(t *testing.T) {
	t.Parallel()
	spec := runSpec{runID: "spool-run", grid: "g", size: 2, points: 2, raw: 2, protocol: true, exec: true, engine: true}
	for name, tc := range map[string]struct {
		linked   func(spoolDir string) string // the path a link is planted at
		madeHere bool                         // the merger makes the spool directory itself
	}{
		"the spool directory": {
			linked:   func(spoolDir string) string { return spoolDir },
			madeHere: true,
		},
		"the run's directory in the spool": {
			linked: func(spoolDir string) string { return filepath.Join(spoolDir, streams.EncodeToken(spec.runID)) },
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := natsservertest.Start(t)
			ctx := context.Background()
			store := benchstore.NewBenchStore(env.JS, 1, streams.DefaultConfig()) // every body through the object store
			spoolDir := filepath.Join(t.TempDir(), "fpmbus-merge")
			if !tc.madeHere {
				if err := os.Mkdir(spoolDir, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			link, elsewhere := tc.linked(spoolDir), t.TempDir()
			if err := os.Symlink(elsewhere, link); err != nil {
				t.Fatal(err)
			}
			var logged lockedLog
			out := filepath.Join(t.TempDir(), "m_"+RunIDPlaceholder+".json")
			r := startConsumer(t, env, Config{Output: out, SpoolDir: spoolDir, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			for _, rf := range spec.rankFiles() {
				if _, _, err := publishRank(ctx, store, rf.Path, rf.Data); err != nil {
					t.Fatal(err)
				}
			}
			refusal := link + " is a symbolic link to " + elsewhere
			waitFor(t, "the spool refused, naming "+link, 20*time.Second, func() bool {
				return strings.Contains(logged.String(), refusal)
			})
			r.quiet(t, 100*time.Millisecond)
			if entries, err := os.ReadDir(elsewhere); err != nil || len(entries) != 0 {
				t.Fatalf("rank bodies written through the link at %s into %s: %v, %v", link, elsewhere, entries, err)
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("the link planted at %s was replaced or removed: %v, %v", link, fi, err)
			}

			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if ev := r.next(t, EventMerged); ev.RunID != spec.runID || len(ev.SourceRanks) != spec.size {
				t.Fatalf("merged event %+v", ev)
			}
			fi, err := os.Lstat(spoolDir)
			if err != nil || !fi.IsDir() || (tc.madeHere && fi.Mode().Perm() != 0o700) {
				t.Fatalf("spool directory %s after the merge: %v, %v (made here: %v, want mode 0700)", spoolDir, fi, err, tc.madeHere)
			}
			waitFor(t, "the run's spool removed after the merge", 10*time.Second, func() bool { // the event comes first
				entries, err := os.ReadDir(spoolDir)
				return err == nil && len(entries) == 0
			})
		})
	}
}
