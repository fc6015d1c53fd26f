package merge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// DefaultOutputTemplate is where the consumer writes each run's merged artefact (Dynamo's
// /tmp/benchmark_results_merged.json naming, one file per run); the sidecar goes next to it with the
// _worker_probe suffix.
const DefaultOutputTemplate = "/tmp/benchmark_results_" + RunIDPlaceholder + "_merged.json"

// Defaults of Config.
const (
	DefaultDurable     = "fpmbus-merge"
	DefaultRankTimeout = 15 * time.Minute
	DefaultAckWait     = 2 * time.Minute
)

// ErrInvalidConfig wraps every Config problem.
var ErrInvalidConfig = errors.New("merge: invalid config")

// Config configures a Consumer. Zero values take the defaults noted.
type Config struct {
	// Durable is the consumer name [DefaultDurable]; with Partitions > 1, "-p<i>of<n>" is appended so
	// each partition has its own durable.
	Durable string
	// Partition and Partitions: this instance owns the runs with Partition(run_id, Partitions) ==
	// Partition [0 of 1]. Run exactly one instance per partition.
	Partition, Partitions int
	// RankTimeout: a run whose ranks have not all arrived this long after its first rank (by stream time)
	// is reported incomplete [DefaultRankTimeout].
	RankTimeout time.Duration
	// Output is the merged artefact path; RunIDPlaceholder is replaced by the run id [DefaultOutputTemplate].
	Output string
	// SpoolDir holds rank bodies fetched from the object store while a run merges [<tmp>/fpmbus-merge].
	SpoolDir string
	// AckWait of the durable [DefaultAckWait]; held rank messages are kept alive with InProgress.
	AckWait time.Duration
	// InlineMax is the largest body the consumer publishes inline (merged artefact, sidecar) [streams.DefaultBenchInlineMax].
	InlineMax int
	// Streams are applied at start and give the object bucket's settings [streams.DefaultConfig()].
	Streams *streams.Config
	// Logger [slog.Default()].
	Logger *slog.Logger
	// Now is the clock for rank timeouts [time.Now].
	Now func() time.Time
	// OnEvent, when set, is called (on the consumer's goroutine) with every event the consumer publishes.
	OnEvent func(Event)
}

func (c *Config) fill() error {
	if c.Durable == "" {
		c.Durable = DefaultDurable
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.Partitions < 1 || c.Partition < 0 || c.Partition >= c.Partitions {
		return fmt.Errorf("%w: partition %d of %d", ErrInvalidConfig, c.Partition, c.Partitions)
	}
	if suffix := fmt.Sprintf("-p%dof%d", c.Partition, c.Partitions); c.Partitions > 1 && !strings.HasSuffix(c.Durable, suffix) {
		c.Durable += suffix
	}
	if c.RankTimeout == 0 {
		c.RankTimeout = DefaultRankTimeout
	}
	if c.RankTimeout < 0 {
		return fmt.Errorf("%w: rank timeout %v must be positive", ErrInvalidConfig, c.RankTimeout)
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.AckWait < time.Second {
		return fmt.Errorf("%w: ack wait %v must be at least 1s", ErrInvalidConfig, c.AckWait)
	}
	if c.Output == "" {
		c.Output = DefaultOutputTemplate
	}
	if !strings.Contains(c.Output, RunIDPlaceholder) {
		return fmt.Errorf("%w: output %q must contain %s: the consumer merges many runs", ErrInvalidConfig, c.Output, RunIDPlaceholder)
	}
	if c.SpoolDir == "" {
		c.SpoolDir = filepath.Join(os.TempDir(), "fpmbus-merge")
	}
	if c.Streams == nil {
		sc := streams.DefaultConfig()
		c.Streams = &sc
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Event is the JSON body of an event on fpmevents.bench.<run>.* (Fpm-Event header = Event).
type Event struct {
	Event string `json:"event"` // bench_merged | bench_rejected | bench_incomplete | bench_conflict
	RunID string `json:"run_id"`
	// Rejections and conflicts.
	Rank   *int   `json:"rank,omitempty"`
	Point  string `json:"point,omitempty"`
	Rule   Rule   `json:"rule,omitempty"`
	Detail string `json:"detail,omitempty"`
	File   string `json:"file,omitempty"`
	// Incomplete runs.
	DPSize       int   `json:"dp_size,omitempty"`
	PresentRanks []int `json:"present_ranks,omitempty"`
	MissingRanks []int `json:"missing_ranks,omitempty"`
	// Merged runs.
	MergedPath    string            `json:"merged_path,omitempty"`
	MergedSHA256  string            `json:"merged_sha256,omitempty"`
	SidecarPath   string            `json:"sidecar_path,omitempty"`
	SourceRanks   []int             `json:"source_ranks,omitempty"`
	Points        int               `json:"points,omitempty"`
	CaptureErrors map[string]string `json:"capture_errors,omitempty"`
	// Conflicts: the digest kept (first published) and the one refused.
	KeptSHA256        string `json:"kept_sha256,omitempty"`
	ConflictSHA256    string `json:"conflict_sha256,omitempty"`
	ConsumerPartition string `json:"partition,omitempty"`
}

// Consumer is the durable merger. It folds the rank artefacts of each run it owns as they arrive on
// FPM_BENCH and, when every rank of dp.size is present, merges them (Merge), writes the merged artefact
// and sidecar (WriteResult), publishes them on FPM_BENCH and an outcome event on FPM_EVENTS, and only
// then acks the run's rank messages. Invariants:
//
//   - One owner per run: the partition of the run_id (see Partition); other runs' messages are acked
//     unread. Messages of a run in progress stay unacked (kept alive with InProgress), so a crash or
//     restart replays them to the same partition's durable.
//   - One outcome per run: a run is merged, rejected or reported incomplete once. Before folding a run
//     the consumer looks for its merged message (FPM_BENCH) and outcome event (FPM_EVENTS); a run with
//     either is final, so re-delivered or re-published ranks never produce a second merged artefact.
//   - Within a run the first publication of a rank (lowest stream sequence) wins; a re-publication with
//     other bytes is reported as a bench_conflict event and never used. After the merge, a rank whose
//     digest differs from the merged one is reported the same way.
//   - Probe replies are read from the stream when the run merges; a reply arriving after the merge
//     rewrites the sidecar (never the merged artefact).
//
// All state is owned by the goroutine running Run.
type Consumer struct {
	js    jetstream.JetStream
	cfg   Config
	store *streams.BenchStore
	log   *slog.Logger

	bench, events jetstream.Stream
	cons          jetstream.Consumer
	maxSeq        uint64 // highest stream sequence handled
	runs          map[string]*pendingRun
	done          map[string]*doneRun

	closeOnce sync.Once
	quit      chan struct{}
	stopped   chan struct{}
}

type heldRank struct {
	seq    uint64
	digest string
	dpSize int
	file   string
	hdr    nats.Header
	data   []byte
	msgs   []jetstream.Msg
}

type pendingRun struct {
	runID     string
	first     time.Time // stream time of the earliest rank message
	ranks     map[int]*heldRank
	conflicts map[string]bool // "<rank>:<digest>" already reported
	retryAt   time.Time
	backoff   time.Duration
}

type doneRun struct {
	outcome  string          // an Event* constant
	digests  map[int]string  // merged runs: rank -> sha256
	probe    *ProbeContext   // merged runs with an engine block
	reported map[string]bool // conflicts reported after the outcome
}

// New returns a consumer; Run starts it.
func New(js jetstream.JetStream, cfg Config) (*Consumer, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Consumer{
		js: js, cfg: cfg, log: cfg.Logger.With("component", "merge", "partition", fmt.Sprintf("%d/%d", cfg.Partition, cfg.Partitions)),
		store: streams.NewBenchStore(js, cfg.InlineMax, *cfg.Streams),
		runs:  map[string]*pendingRun{}, done: map[string]*doneRun{},
		quit: make(chan struct{}), stopped: make(chan struct{}),
	}, nil
}

// Durable returns the durable consumer name in use.
func (c *Consumer) Durable() string { return c.cfg.Durable }

// Run ensures the streams exist, declares the durable consumer and merges until ctx ends or Close is called.
// It returns nil on a requested stop.
func (c *Consumer) Run(ctx context.Context) error {
	defer close(c.stopped)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := streams.Ensure(ctx, c.js, *c.cfg.Streams, c.log); err != nil {
		return err
	}
	if _, err := c.store.Objects(ctx); err != nil {
		return err
	}
	var err error
	if c.bench, err = c.js.Stream(ctx, streams.StreamBench); err != nil {
		return fmt.Errorf("merge: stream %s: %w", streams.StreamBench, err)
	}
	if c.events, err = c.js.Stream(ctx, streams.StreamEvents); err != nil {
		return fmt.Errorf("merge: stream %s: %w", streams.StreamEvents, err)
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, streams.StreamBench, jetstream.ConsumerConfig{
		Durable:        c.cfg.Durable,
		Description:    fmt.Sprintf("fpmbus benchmark merger, partition %d of %d", c.cfg.Partition, c.cfg.Partitions),
		FilterSubjects: []string{streams.BenchRankWildcard, streams.BenchProbeWildcard},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.cfg.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  100000,
	})
	if err != nil {
		return fmt.Errorf("merge: consumer %s: %w", c.cfg.Durable, err)
	}
	c.cons = cons
	it, err := cons.Messages(jetstream.PullMaxMessages(64))
	if err != nil {
		return fmt.Errorf("merge: consume: %w", err)
	}
	// The reader forwards every message until the iterator is closed, then closes msgs. Shutdown
	// drains the iterator (it stops pulling and hands over what it buffered) and naks everything not
	// handled, so the next instance of this partition gets it at once rather than after AckWait.
	msgs := make(chan jetstream.Msg)
	go func() {
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return
				}
				time.Sleep(100 * time.Millisecond)
				continue
			}
			msgs <- m
		}
	}()
	c.log.Info("merger started", "durable", c.cfg.Durable, "output", c.cfg.Output, "rank_timeout", c.cfg.RankTimeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastBeat := time.Now()
	for {
		select {
		case <-ctx.Done():
			it.Drain()
			for m := range msgs {
				_ = m.Nak()
			}
			for _, run := range c.runs {
				for _, h := range run.ranks {
					for _, m := range h.msgs {
						_ = m.Nak()
					}
				}
			}
			c.log.Info("merger stopped", "pending_runs", len(c.runs))
			return nil
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("merge: consumer %s: message iterator closed", c.cfg.Durable)
			}
			c.handle(ctx, m)
		case <-tick.C:
			if time.Since(lastBeat) > c.cfg.AckWait/3 {
				c.heartbeat()
				lastBeat = time.Now()
			}
			c.sweep(ctx)
		}
	}
}

// Close stops Run and waits for it, or for ctx. Unacked messages of runs in progress are redelivered to
// the next instance of this partition.
func (c *Consumer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { close(c.quit) })
	select {
	case <-c.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("merge: close: %w", ctx.Err())
	}
}

func (c *Consumer) heartbeat() {
	for _, run := range c.runs {
		for _, h := range run.ranks {
			for _, m := range h.msgs {
				_ = m.InProgress()
			}
		}
	}
}

func (c *Consumer) handle(ctx context.Context, m jetstream.Msg) {
	if meta, err := m.Metadata(); err == nil {
		c.maxSeq = max(c.maxSeq, meta.Sequence.Stream)
	}
	kind, runID, rank, err := streams.ParseBenchSubject(m.Subject())
	if err != nil {
		c.log.Warn("ignoring a message on an unexpected subject", "subject", m.Subject(), "error", err)
		_ = m.Term()
		return
	}
	if Partition(runID, c.cfg.Partitions) != c.cfg.Partition {
		_ = m.Ack()
		return
	}
	done, err := c.lookupDone(ctx, runID)
	if err != nil {
		c.log.Warn("cannot tell whether the run is already merged; retrying", "run_id", runID, "error", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	if kind == streams.BenchKindProbe {
		if done != nil && done.probe != nil {
			if err := c.refreshSidecar(ctx, runID, done.probe); err != nil {
				c.log.Warn("rewriting the sidecar for late probe replies failed; retrying", "run_id", runID, "error", err)
				_ = m.NakWithDelay(5 * time.Second)
				return
			}
		}
		_ = m.Ack() // pending runs read their probe replies from the stream when they merge
		return
	}
	meta, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	digest := m.Headers().Get(streams.HeaderBenchSHA256)
	if done != nil {
		c.afterOutcome(ctx, runID, rank, digest, m, done)
		return
	}
	run := c.runs[runID]
	if run == nil {
		run = &pendingRun{runID: runID, first: meta.Timestamp, ranks: map[int]*heldRank{}, conflicts: map[string]bool{}}
		c.runs[runID] = run
	}
	if meta.Timestamp.Before(run.first) {
		run.first = meta.Timestamp
	}
	dpSize, _ := strconv.Atoi(m.Headers().Get(streams.HeaderBenchDPSize))
	seq := meta.Sequence.Stream
	h := run.ranks[rank]
	switch {
	case h == nil:
		run.ranks[rank] = &heldRank{seq: seq, digest: digest, dpSize: dpSize, file: m.Headers().Get(streams.HeaderBenchFile), hdr: m.Headers(), data: m.Data(), msgs: []jetstream.Msg{m}}
	case h.digest == digest:
		h.msgs = append(h.msgs, m) // a redelivery or an identical re-publication
	default:
		kept, refused := h, &heldRank{seq: seq, digest: digest, dpSize: dpSize, file: m.Headers().Get(streams.HeaderBenchFile), hdr: m.Headers(), data: m.Data(), msgs: []jetstream.Msg{m}}
		if seq < h.seq { // the earlier publication wins, whatever the delivery order
			kept, refused = refused, h
			run.ranks[rank] = kept
		}
		c.reportConflict(ctx, run.conflicts, runID, rank, kept.digest, refused.digest, refused.file, "the rank was published again with different bytes; the first publication is kept")
		for _, rm := range refused.msgs {
			_ = rm.Ack()
		}
	}
	c.tryMerge(ctx, run)
}

// afterOutcome handles a rank of a run that already has its outcome.
func (c *Consumer) afterOutcome(ctx context.Context, runID string, rank int, digest string, m jetstream.Msg, done *doneRun) {
	defer func() { _ = m.Ack() }()
	if done.outcome != EventMerged {
		c.log.Info("ignoring a rank of a run already reported", "run_id", runID, "rank", rank, "outcome", done.outcome)
		return
	}
	kept, ok := done.digests[rank]
	switch {
	case ok && kept == digest:
		return // a redelivery or an identical re-publication
	case ok:
		c.reportConflict(ctx, done.reported, runID, rank, kept, digest, m.Headers().Get(streams.HeaderBenchFile), "the run is already merged with other bytes for this rank; the merged artefact stands")
	default:
		c.reportConflict(ctx, done.reported, runID, rank, "", digest, m.Headers().Get(streams.HeaderBenchFile), "the run is already merged without this rank; the merged artefact stands")
	}
}

func (c *Consumer) reportConflict(ctx context.Context, seen map[string]bool, runID string, rank int, kept, refused, file, detail string) {
	key := strconv.Itoa(rank) + ":" + refused
	if seen[key] {
		return
	}
	seen[key] = true
	ev := Event{Event: EventConflict, RunID: runID, Rank: intp(rank), Detail: detail, File: file, KeptSHA256: kept, ConflictSHA256: refused}
	c.log.Warn("conflicting re-publication of a benchmark rank", "run_id", runID, "rank", rank, "kept_sha256", kept, "conflict_sha256", refused, "detail", detail)
	if err := c.publishEvent(ctx, streams.BenchConflictSubject(runID), streams.BenchConflictMsgID(runID, rank, refused), ev); err != nil {
		c.log.Warn("publishing the conflict event failed", "run_id", runID, "error", err)
	}
}

// readyRanks reports whether every rank of the lowest held rank's dp.size is held.
func (run *pendingRun) expected() (size int, missing []int) {
	low := -1
	for r := range run.ranks {
		if low < 0 || r < low {
			low = r
		}
	}
	if low < 0 {
		return 0, nil
	}
	size = run.ranks[low].dpSize
	for r := range size {
		if run.ranks[r] == nil {
			missing = append(missing, r)
		}
	}
	return size, missing
}

func (c *Consumer) tryMerge(ctx context.Context, run *pendingRun) {
	size, missing := run.expected()
	if size < 1 || len(missing) > 0 || c.cfg.Now().Before(run.retryAt) {
		return
	}
	err := c.mergeRun(ctx, run)
	if err == nil {
		return
	}
	run.backoff = min(max(run.backoff*2, time.Second), time.Minute)
	run.retryAt = c.cfg.Now().Add(run.backoff)
	c.log.Warn("merging the run failed; retrying", "run_id", run.runID, "retry_in", run.backoff, "error", err)
}

// caughtUp reports whether every message the durable has delivered has been handled and none is
// pending: only then is a rank that has not arrived missing rather than still in the backlog (after a
// restart, a run's first rank can be older than the rank timeout while its other ranks wait behind it).
func (c *Consumer) caughtUp(ctx context.Context) bool {
	if c.cons == nil {
		return true
	}
	ci, err := c.cons.Info(ctx)
	return err == nil && ci.NumPending == 0 && c.maxSeq >= ci.Delivered.Stream
}

// sweep retries failed merges and reports runs whose ranks did not all arrive in time.
func (c *Consumer) sweep(ctx context.Context) {
	now := c.cfg.Now()
	checked, caughtUp := false, false
	for _, id := range slices.Sorted(maps.Keys(c.runs)) {
		run := c.runs[id]
		size, missing := run.expected()
		if len(missing) == 0 && size > 0 {
			c.tryMerge(ctx, run)
			continue
		}
		if now.Sub(run.first) < c.cfg.RankTimeout {
			continue
		}
		if !checked {
			checked, caughtUp = true, c.caughtUp(ctx)
		}
		if !caughtUp {
			continue
		}
		present := slices.Sorted(maps.Keys(run.ranks))
		ev := Event{Event: EventIncomplete, RunID: id, DPSize: size, PresentRanks: present, MissingRanks: missing,
			Detail: fmt.Sprintf("ranks %v of dp.size %d did not arrive within %v of the first rank", missing, size, c.cfg.RankTimeout)}
		c.log.Error("benchmark run incomplete", "run_id", id, "missing_ranks", missing, "present_ranks", present, "dp_size", size, "rank_timeout", c.cfg.RankTimeout)
		if err := c.finish(ctx, run, ev, nil); err != nil {
			c.log.Warn("reporting the incomplete run failed; retrying", "run_id", id, "error", err)
		}
	}
}

// mergeRun merges a run whose ranks are all held. A rejection is final; any other error is retried.
func (c *Consumer) mergeRun(ctx context.Context, run *pendingRun) error {
	spool := filepath.Join(c.cfg.SpoolDir, streams.EncodeToken(run.runID))
	defer os.RemoveAll(spool)
	var files []RankFile
	for _, r := range slices.Sorted(maps.Keys(run.ranks)) {
		h := run.ranks[r]
		rf := RankFile{Rank: r, Path: h.file}
		if h.hdr.Get(streams.HeaderBenchObject) == "" {
			if schemas.SHA256Hex(h.data) != h.digest {
				return c.reject(ctx, run, &RejectError{RunID: run.runID, Rank: intp(r), Rule: RuleMalformedJSON, File: h.file,
					Detail: "the message body does not match its " + streams.HeaderBenchSHA256 + " header"})
			}
			rf.Data = h.data
		} else {
			path := filepath.Join(spool, strconv.Itoa(r)+".json")
			if err := c.fetchToFile(ctx, h, path); err != nil {
				if errors.Is(err, streams.ErrDigestMismatch) {
					return c.reject(ctx, run, &RejectError{RunID: run.runID, Rank: intp(r), Rule: RuleMalformedJSON, File: h.file, Detail: err.Error()})
				}
				return err
			}
			rf.Load = func() ([]byte, error) { return os.ReadFile(path) }
		}
		files = append(files, rf)
	}
	probes, err := c.readProbes(ctx, run.runID)
	if err != nil {
		return err
	}
	out := ExpandPath(c.cfg.Output, run.runID)
	res, err := Merge(files, probes, Options{MergedPath: out, RequireAllRanks: true})
	if err != nil {
		var rej *RejectError
		if errors.As(err, &rej) {
			return c.reject(ctx, run, rej)
		}
		return err
	}
	digest, _, err := WriteResult(res)
	if err != nil {
		return err
	}
	if err := c.publishMerged(ctx, run, res, digest); err != nil {
		return err
	}
	ev := Event{Event: EventMerged, RunID: run.runID, MergedPath: res.MergedPath, MergedSHA256: digest,
		SourceRanks: res.SourceRanks, Points: res.Points}
	if res.Sidecar != nil {
		ev.SidecarPath = res.SidecarPath
	}
	if len(res.CaptureErrors) > 0 {
		ev.CaptureErrors = map[string]string{}
		for r, e := range res.CaptureErrors {
			ev.CaptureErrors[strconv.Itoa(r)] = e
		}
		c.log.Warn("engine provenance capture failed or was absent on some ranks; the merged engine block is unverified across them",
			"run_id", run.runID, "capture_errors", ev.CaptureErrors)
	}
	c.log.Info("benchmark run merged", "run_id", run.runID, "ranks", res.SourceRanks, "points", res.Points,
		"merged", res.MergedPath, "sha256", digest, "sidecar", ev.SidecarPath)
	return c.finish(ctx, run, ev, &res.Probe)
}

func (c *Consumer) reject(ctx context.Context, run *pendingRun, rej *RejectError) error {
	if rej.RunID == "" {
		rej.RunID = run.runID
	}
	c.log.Error("benchmark run rejected", rej.LogAttrs()...)
	ev := Event{Event: EventRejected, RunID: run.runID, Rank: rej.Rank, Point: rej.Point, Rule: rej.Rule, Detail: rej.Detail, File: rej.File}
	return c.finish(ctx, run, ev, nil)
}

// finish publishes a run's outcome event, acks its messages and forgets it.
func (c *Consumer) finish(ctx context.Context, run *pendingRun, ev Event, probe *ProbeContext) error {
	if err := c.publishEvent(ctx, streams.BenchOutcomeSubject(run.runID), streams.BenchOutcomeMsgID(run.runID), ev); err != nil {
		return err
	}
	d := &doneRun{outcome: ev.Event, digests: map[int]string{}, reported: run.conflicts}
	if ev.Event == EventMerged {
		for r, h := range run.ranks {
			d.digests[r] = h.digest
		}
		if probe != nil && probe.WorkerProbePath != "" {
			d.probe = probe
		}
	}
	for _, h := range run.ranks {
		for _, m := range h.msgs {
			_ = m.Ack()
		}
	}
	c.done[run.runID] = d
	delete(c.runs, run.runID)
	return nil
}

func (c *Consumer) publishEvent(ctx context.Context, subject, msgID string, ev Event) error {
	ev.ConsumerPartition = fmt.Sprintf("%d/%d", c.cfg.Partition, c.cfg.Partitions)
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	msg.Header.Set(streams.HeaderEventType, ev.Event)
	msg.Header.Set(streams.HeaderBenchRun, ev.RunID)
	msg.Header.Set(streams.HeaderMsgID, msgID)
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("merge: publish %s event: %w", ev.Event, err)
	}
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(ev)
	}
	return nil
}

func (c *Consumer) publishMerged(ctx context.Context, run *pendingRun, res *Result, digest string) error {
	m := streams.BenchMerged{RunID: run.runID, Path: res.MergedPath, Digest: digest, RankDigests: map[int]string{}}
	for r, h := range run.ranks {
		m.RankDigests[r] = h.digest
	}
	if res.Sidecar != nil {
		pc, err := json.Marshal(res.Probe)
		if err != nil {
			return err
		}
		m.ProbeContext = pc
	}
	if _, err := c.store.PublishMerged(ctx, m); err != nil {
		return err
	}
	if res.Sidecar != nil {
		return c.publishSidecar(ctx, run.runID, res.SidecarPath)
	}
	return nil
}

func (c *Consumer) publishSidecar(ctx context.Context, runID, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, err = c.store.PublishSidecar(ctx, runID, path, data)
	return err
}

// refreshSidecar recomputes a merged run's sidecar from every probe reply on the stream.
func (c *Consumer) refreshSidecar(ctx context.Context, runID string, pc *ProbeContext) error {
	probes, err := c.readProbes(ctx, runID)
	if err != nil {
		return err
	}
	if err := WriteSidecar(pc.WorkerProbePath, BuildSidecar(*pc, probes)); err != nil {
		return err
	}
	c.log.Info("worker-probe sidecar rewritten for late probe replies", "run_id", runID, "sidecar", pc.WorkerProbePath, "batches", len(probes))
	return c.publishSidecar(ctx, runID, pc.WorkerProbePath)
}

func (c *Consumer) fetchToFile(ctx context.Context, h *heldRank, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := c.store.FetchTo(ctx, h.hdr, nil, f); err != nil {
		return err
	}
	return f.Close()
}

// readProbes returns every probe reply batch of a run, in stream order.
func (c *Consumer) readProbes(ctx context.Context, runID string) ([]ProbeReplies, error) {
	var out []ProbeReplies
	subj := streams.BenchProbeSubject(runID)
	seq := uint64(1)
	for {
		raw, err := c.bench.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("merge: read probe replies of %s: %w", runID, err)
		}
		seq = raw.Sequence + 1
		data, err := c.store.Fetch(ctx, raw.Header, raw.Data)
		if err != nil {
			c.log.Warn("skipping unreadable probe replies", "run_id", runID, "seq", raw.Sequence, "error", err)
			continue
		}
		pr, err := ParseProbeReplies(data, fmt.Sprintf("%s seq %d", streams.StreamBench, raw.Sequence))
		if err != nil {
			c.log.Warn("skipping malformed probe replies", "run_id", runID, "seq", raw.Sequence, "error", err)
			continue
		}
		out = append(out, pr)
	}
}

// lookupDone returns the outcome of a run already merged, rejected or reported incomplete (nil when the
// run is open), from memory or from the streams.
func (c *Consumer) lookupDone(ctx context.Context, runID string) (*doneRun, error) {
	if d, ok := c.done[runID]; ok {
		return d, nil
	}
	if _, open := c.runs[runID]; open {
		return nil, nil
	}
	raw, err := c.bench.GetLastMsgForSubject(ctx, streams.BenchMergedSubject(runID))
	switch {
	case err == nil:
		d := &doneRun{outcome: EventMerged, digests: streams.ParseBenchRankDigests(raw.Header.Get(streams.HeaderBenchRankDigests)),
			reported: map[string]bool{}}
		if s := raw.Header.Get(streams.HeaderBenchProbeContext); s != "" {
			var pc ProbeContext
			if err := json.Unmarshal([]byte(s), &pc); err == nil {
				d.probe = &pc
			}
		}
		// A crash between publishing the merged artefact and its outcome event leaves no event: add it.
		if _, err := c.events.GetLastMsgForSubject(ctx, streams.BenchOutcomeSubject(runID)); errors.Is(err, jetstream.ErrMsgNotFound) {
			ev := Event{Event: EventMerged, RunID: runID, MergedPath: raw.Header.Get(streams.HeaderBenchFile), MergedSHA256: raw.Header.Get(streams.HeaderBenchSHA256),
				Detail: "outcome recorded after a restart"}
			if d.probe != nil {
				ev.SidecarPath = d.probe.WorkerProbePath
			}
			if err := c.publishEvent(ctx, streams.BenchOutcomeSubject(runID), streams.BenchOutcomeMsgID(runID), ev); err != nil {
				return nil, err
			}
		}
		c.done[runID] = d
		return d, nil
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, err
	}
	raw, err = c.events.GetLastMsgForSubject(ctx, streams.BenchOutcomeSubject(runID))
	switch {
	case err == nil:
		var ev Event
		_ = json.Unmarshal(raw.Data, &ev)
		if ev.Event == "" {
			ev.Event = raw.Header.Get(streams.HeaderEventType)
		}
		d := &doneRun{outcome: ev.Event, reported: map[string]bool{}}
		c.done[runID] = d
		return d, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, nil
	}
	return nil, err
}
