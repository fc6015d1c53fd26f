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
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/retrywait"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// errNotRankArtefact is the reason a rank message without the publish protocol's headers (a valid
// Fpm-Bench-Sha256 and Fpm-Bench-Dp-Size), or on a subject that is not fpmbench.rank.<run>.<rank> or
// fpmbench.probe.<run>, is rejected: it can never be merged, so it is dead-lettered at once.
var errNotRankArtefact = errors.New("merge: not a rank artefact or probe replies publication")

// ruleOutputPath is the rule of a bench_rejected outcome the consumer reports itself, not Merge: the
// file system refuses the run's merged artefact path (ENAMETOOLONG: a name longer than NAME_MAX or a
// path longer than PATH_MAX), which no retry can change.
const ruleOutputPath rule = "output_path"

// permanent reports a failed merge that no retry can change: the file system refuses a name of the
// run's (ENAMETOOLONG). Every other failure (the server, a full disk, permissions) may pass, and the
// run is tried again with backoff.
func permanent(err error) bool { return errors.Is(err, syscall.ENAMETOOLONG) }

// maxOutcomeSubject is the longest outcome subject the merger publishes. A run whose token makes a
// longer one (only a run_id far over streams.MaxRunIDToken does) is reported with a dead letter of each
// of its messages instead, whose subject is fixed: a protocol line longer than the server's
// max_control_line (4096 bytes by default) would make the server close the merger's connection.
const maxOutcomeSubject = 1024

// Event is the JSON body of an event on fpmevents.bench.<run>.* (Fpm-Event header = Event).
type Event struct {
	Event string `json:"event"` // bench_merged | bench_rejected | bench_incomplete | bench_conflict
	RunID string `json:"run_id"`
	// Rejections and conflicts.
	Rank   *int   `json:"rank,omitempty"`
	Point  string `json:"point,omitempty"`
	Rule   rule   `json:"rule,omitempty"`
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

// Consumer is the durable merger behind `fpmbus merge` and `fpmbus up`: a durable.Consumer run by a
// durable.Runner in the partition group Config.Group. It folds the rank artefacts of each run of the
// partitions it owns as they arrive on FPM_BENCH and, when every rank of dp.size is present, merges
// them (Merge), writes the merged artefact and sidecar (WriteResult), publishes them on FPM_BENCH and
// an outcome event on FPM_EVENTS, and only then marks the run's rank messages done. Invariants:
//
//   - One owner per run: a run's ranks and probe replies share a partition (keyed by run_id), and a
//     partition has one owner at a time. A rank of a run in progress is held (never done), and the
//     runner keeps it alive with in-progress acks; when the partition moves (rebalance, stop, crash)
//     the held ranks are forgotten here and delivered again, in stream order, to the next owner.
//   - One outcome per run: a run is merged, rejected or reported incomplete once. Before folding a run
//     the consumer looks for its merged message (FPM_BENCH) and outcome event (FPM_EVENTS); a run with
//     either is final, so redelivered ranks after a takeover, or re-published ones, never produce a
//     second merged artefact.
//   - Within a run the first publication of a rank (lowest stream sequence) wins; a re-publication with
//     other bytes is reported as a bench_conflict event and never used. After the merge, a rank whose
//     digest differs from the merged one is reported the same way.
//   - Probe replies are read from the stream when the run merges; a reply arriving after the merge
//     rewrites the sidecar (never the merged artefact).
//   - A message that can never be merged (not a rank artefact publication) is rejected: one dead
//     letter, never delivered again. A run whose artefacts break a merge rule gets one bench_rejected
//     outcome and its messages are done.
type Consumer struct {
	runner *durable.Runner
	m      *stage
}

var _ durable.PartitionObserver = (*stage)(nil)

// stage is the durable.Consumer. Every method runs on the runner's loop goroutine: no locks.
type stage struct {
	durable.ForgetOnHandover // Forget: forget
	js                       jetstream.JetStream
	cfg                      Config
	group                    durable.GroupConfig
	store                    *benchstore.BenchStore
	log                      *slog.Logger
	now                      func() time.Time
	onEvent                  func(Event)
	// outcomes counts the outcome events published (fpmbus_merge_runs_total).
	outcomes *prometheus.CounterVec

	bench, events jetstream.Stream
	runs          map[string]*pendingRun
	done          map[string]*doneRun
	// deferred are messages whose handling failed for a reason that may pass (the server, the
	// object store); Tick handles them again. They stay held meanwhile.
	deferred []*durable.Msg
}

type heldRank struct {
	seq    uint64
	digest string
	dpSize int
	file   string
	hdr    nats.Header
	data   []byte
	msgs   []*durable.Msg
}

type pendingRun struct {
	runID     string
	partition int
	first     time.Time // stream time of the earliest rank message
	ranks     map[int]*heldRank
	conflicts map[string]bool // "<rank>:<digest>" already reported
	retryAt   time.Time
	waits     backoff.BackOff // nil until the first failed merge
}

type doneRun struct {
	outcome  string          // an Event* constant
	digests  map[int]string  // merged runs: rank -> sha256
	probe    *probeContext   // merged runs with an engine block
	reported map[string]bool // conflicts reported after the outcome
}

// New checks cfg and opts and returns a merger; Run starts it. Nothing is declared on the server
// before Run.
// Options: durable.WithMemberID, durable.WithClock (rank timeouts and retries).
func New(cfg Config, js jetstream.JetStream, opts ...durable.Option) (*Consumer, error) {
	set, err := durable.CheckStage(cfg.fill, js, ErrInvalidConfig, opts)
	if err != nil {
		return nil, err
	}
	m := &stage{
		js: js, cfg: cfg, group: cfg.Group(), log: cfg.Logger.With("component", "merge", "group", cfg.Durable),
		now: set.Clock, onEvent: cfg.EventHook,
		store: benchstore.NewBenchStore(js, cfg.InlineMax, *cfg.Streams),
		runs:  map[string]*pendingRun{}, done: map[string]*doneRun{},
	}
	m.Forget = m.forget
	runs, err := registerRuns(cfg.Registerer, newRunsTotal())
	if err != nil {
		return nil, fmt.Errorf("%w: register metrics: %v", ErrInvalidConfig, err)
	}
	m.outcomes = runs
	rc := cfg.RunnerConfig(ConsumerName, m.group, tickInterval)
	rc.Logger, rc.Registerer = cfg.Logger.With("component", ConsumerName), cfg.Registerer
	r, err := durable.New(rc, js, m, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return &Consumer{runner: r, m: m}, nil
}

// Ready is closed once Run has prepared the streams and the object store, joined the group and is
// taking partitions. It is never closed if Run fails before that; wait for Run's result as well.
func (c *Consumer) Ready() <-chan struct{} { return c.runner.Ready() }

// Owned lists the partitions this instance owns now.
func (c *Consumer) Owned() []int { return c.runner.Owned() }

// Group is the partition group the merger is a member of (defaults filled in).
func (c *Consumer) Group() durable.GroupConfig { return c.m.group }

// Run ensures the streams and the object store exist, joins the group and merges until ctx ends, then
// stops gracefully (the ranks of unfinished runs go, unacked, to the next owner at once). It returns
// nil after a requested stop.
func (c *Consumer) Run(ctx context.Context) error {
	m := c.m
	if _, err := streams.Ensure(ctx, m.js, *m.cfg.Streams, m.log); err != nil {
		return err
	}
	if _, err := m.store.Objects(ctx); err != nil {
		return err
	}
	var err error
	if m.bench, err = m.js.Stream(ctx, streams.StreamBench); err != nil {
		return fmt.Errorf("merge: stream %s: %w", streams.StreamBench, err)
	}
	if m.events, err = m.js.Stream(ctx, streams.StreamEvents); err != nil {
		return fmt.Errorf("merge: stream %s: %w", streams.StreamEvents, err)
	}
	m.log.Info("merger starting", "partitions", m.group.Partitions, "output", m.cfg.Output, "rank_timeout", m.cfg.RankTimeout)
	return c.runner.Run(ctx)
}

// Handle folds a batch of one partition's messages.
func (c *stage) Handle(ctx context.Context, batch []*durable.Msg) error {
	for _, m := range batch {
		c.handle(ctx, m)
	}
	return nil
}

// Tick handles the deferred messages again, retries failed merges and reports runs whose ranks did
// not all arrive in time.
func (c *stage) Tick(ctx context.Context, _ time.Time) error {
	if len(c.deferred) > 0 {
		again := c.deferred
		c.deferred = nil
		for _, m := range again {
			c.handle(ctx, m)
		}
	}
	c.sweep(ctx)
	return nil
}

// Close ends the merger: what it holds stays unacked for the next owner.
func (c *stage) Close(context.Context) error {
	c.log.Info("merger stopped", "pending_runs", len(c.runs))
	return nil
}

// forget forgets the runs of partition p when it goes, gracefully or not (durable.ForgetOnHandover):
// an unfinished run has nothing durable to write, so its ranks stay unacked and go to the next owner,
// who folds them again. A run's state needs nothing at a takeover either: it is rebuilt from its
// redelivered ranks.
func (c *stage) forget(p int) {
	n := 0
	for id, run := range c.runs {
		if run.partition == p {
			delete(c.runs, id)
			n++
		}
	}
	c.deferred = slices.DeleteFunc(c.deferred, func(m *durable.Msg) bool { return m.Partition == p })
	if n > 0 {
		c.log.Info("partition handed on with runs in progress; their ranks go to the next owner", "partition", p, "runs", n)
	}
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (c *stage) handle(ctx context.Context, m *durable.Msg) {
	kind, runID, rank, err := streams.ParseBenchSubject(m.Subject())
	switch {
	case err != nil:
		m.Reject(fmt.Errorf("%w: %v", errNotRankArtefact, err))
		return
	case kind != streams.BenchKindRank && kind != streams.BenchKindProbe:
		m.Reject(fmt.Errorf("%w: %s is a %s subject", errNotRankArtefact, m.Subject(), kind))
		return
	}
	hdr := m.Headers()
	digest := hdr.Get(streams.HeaderBenchSHA256)
	dpSize, dpErr := strconv.Atoi(hdr.Get(streams.HeaderBenchDPSize))
	if kind == streams.BenchKindRank && (!sha256Hex.MatchString(digest) || dpErr != nil || dpSize < 1) {
		m.Reject(fmt.Errorf("%w: %s has no valid %s (%q) and %s (%q) headers: publish ranks with `fpmbus bench publish`",
			errNotRankArtefact, m.Subject(), streams.HeaderBenchSHA256, digest, streams.HeaderBenchDPSize, hdr.Get(streams.HeaderBenchDPSize)))
		return
	}
	runErr := streams.CheckRunID(runID)
	if runErr != nil && len(streams.BenchOutcomeSubject(runID)) > maxOutcomeSubject {
		m.Reject(fmt.Errorf("%w: %s: %v", errNotRankArtefact, m.Subject()[:64]+"…", runErr))
		return
	}
	done, err := c.lookupDone(ctx, runID)
	if err != nil {
		c.log.Warn("cannot tell whether the run is already merged; retrying", "run_id", runID, "error", err)
		c.deferred = append(c.deferred, m)
		return
	}
	if kind == streams.BenchKindProbe {
		if done != nil && done.probe != nil {
			if err := c.refreshSidecar(ctx, runID, done.probe); err != nil {
				c.log.Warn("rewriting the sidecar for late probe replies failed; retrying", "run_id", runID, "error", err)
				c.deferred = append(c.deferred, m)
				return
			}
		}
		m.Done() // pending runs read their probe replies from the stream when they merge
		return
	}
	if done != nil {
		c.afterOutcome(ctx, runID, rank, digest, m, done)
		return
	}
	run := c.runs[runID]
	if run == nil {
		run = &pendingRun{runID: runID, partition: m.Partition, first: m.Stored, ranks: map[int]*heldRank{}, conflicts: map[string]bool{}}
		c.runs[runID] = run
	}
	// A run_id no subject, object or file name of the run can hold, or a body over the maximum
	// artefact size (told by its header, before it is fetched), can never merge: the run is rejected
	// at once, with this message among its ranks.
	size, _ := strconv.ParseInt(hdr.Get(streams.HeaderBenchSize), 10, 64)
	sizeErr := streams.CheckArtefactSize(fmt.Sprintf("%s seq %d", m.Subject(), m.StreamSeq), max(size, int64(len(m.Data()))), c.cfg.MaxArtefactSize)
	var rej *RejectError
	switch {
	case runErr != nil:
		rej = &RejectError{Rank: intp(rank), Rule: RuleRunID, File: hdr.Get(streams.HeaderBenchFile), Detail: "field run_id: " + runErr.Error()}
	case sizeErr != nil:
		rej = &RejectError{Rank: intp(rank), Rule: RuleArtefactSize, File: hdr.Get(streams.HeaderBenchFile), Detail: sizeErr.Error()}
	}
	if rej != nil {
		if run.ranks[rank] == nil {
			run.ranks[rank] = &heldRank{seq: m.StreamSeq, digest: digest, dpSize: dpSize, file: hdr.Get(streams.HeaderBenchFile), hdr: hdr}
		}
		run.ranks[rank].msgs = append(run.ranks[rank].msgs, m)
		if err := c.reject(ctx, run, rej); err != nil {
			c.log.Warn("reporting the rejected run failed; retrying", "run_id", runID, "error", err)
			run.ranks[rank].msgs = slices.DeleteFunc(run.ranks[rank].msgs, func(x *durable.Msg) bool { return x == m })
			c.deferred = append(c.deferred, m)
		}
		return
	}
	if m.Stored.Before(run.first) {
		run.first = m.Stored
	}
	seq := m.StreamSeq
	h := run.ranks[rank]
	switch {
	case h == nil:
		run.ranks[rank] = &heldRank{seq: seq, digest: digest, dpSize: dpSize, file: hdr.Get(streams.HeaderBenchFile), hdr: hdr, data: m.Data(), msgs: []*durable.Msg{m}}
	case h.digest == digest:
		h.msgs = append(h.msgs, m) // a redelivery or an identical re-publication
	default:
		kept, refused := h, &heldRank{seq: seq, digest: digest, dpSize: dpSize, file: hdr.Get(streams.HeaderBenchFile), hdr: hdr, data: m.Data(), msgs: []*durable.Msg{m}}
		if seq < h.seq { // the earlier publication wins, whatever the delivery order
			kept, refused = refused, h
			run.ranks[rank] = kept
		}
		c.reportConflict(ctx, run.conflicts, runID, rank, kept.digest, refused.digest, refused.file, "the rank was published again with different bytes; the first publication is kept")
		for _, rm := range refused.msgs {
			rm.Done()
		}
	}
	c.tryMerge(ctx, run)
}

// afterOutcome handles a rank of a run that already has its outcome.
func (c *stage) afterOutcome(ctx context.Context, runID string, rank int, digest string, m *durable.Msg, done *doneRun) {
	defer m.Done()
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

func (c *stage) reportConflict(ctx context.Context, seen map[string]bool, runID string, rank int, kept, refused, file, detail string) {
	key := strconv.Itoa(rank) + ":" + refused
	if seen[key] {
		return
	}
	seen[key] = true
	ev := Event{Event: eventConflict, RunID: runID, Rank: intp(rank), Detail: detail, File: file, KeptSHA256: kept, ConflictSHA256: refused}
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

func (c *stage) tryMerge(ctx context.Context, run *pendingRun) {
	size, missing := run.expected()
	if size < 1 || len(missing) > 0 || c.now().Before(run.retryAt) {
		return
	}
	err := c.mergeRun(ctx, run)
	if err == nil {
		return
	}
	if permanent(err) {
		// The run's names (its output path, its spool directory) are too long for the file system:
		// permanent for this run, whatever is retried.
		err = c.reject(ctx, run, &RejectError{RunID: run.runID, Rule: ruleOutputPath, Detail: err.Error()})
		if err == nil {
			return
		}
	}
	if run.waits == nil {
		run.waits = retrywait.Doubling(time.Second, time.Minute)
	}
	wait := run.waits.NextBackOff()
	run.retryAt = c.now().Add(wait)
	c.log.Warn("merging the run failed; retrying", "run_id", run.runID, "retry_in", wait, "error", err)
}

// caughtUp reports whether partition p's consumer has handed this instance everything it has: nothing
// pending on the server and nothing acknowledged-pending beyond the messages held here. Only then is a
// rank that has not arrived missing rather than still in the backlog (after a takeover, a run's first
// rank can be older than the rank timeout while its other ranks wait behind it). Messages marked done
// whose acks are still on their way make it report false: the sweep then waits for the next tick.
func (c *stage) caughtUp(ctx context.Context, p int) bool {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ci, err := durable.ConsumerInfo(cctx, c.js, c.group.ConsumerStream(), c.group.ConsumerName(p))
	if err != nil {
		return false
	}
	held := 0
	for _, run := range c.runs {
		if run.partition == p {
			for _, h := range run.ranks {
				held += len(h.msgs)
			}
		}
	}
	for _, m := range c.deferred {
		if m.Partition == p {
			held++
		}
	}
	return ci.NumPending == 0 && ci.NumAckPending <= held
}

// sweep retries failed merges and reports runs whose ranks did not all arrive in time.
func (c *stage) sweep(ctx context.Context) {
	now := c.now()
	caughtUp := map[int]bool{}
	for _, id := range slices.Sorted(maps.Keys(c.runs)) {
		run := c.runs[id]
		if run == nil {
			continue // finished by an earlier step of this sweep
		}
		size, missing := run.expected()
		if len(missing) == 0 && size > 0 {
			c.tryMerge(ctx, run)
			continue
		}
		if now.Sub(run.first) < c.cfg.RankTimeout {
			continue
		}
		up, checked := caughtUp[run.partition]
		if !checked {
			up = c.caughtUp(ctx, run.partition)
			caughtUp[run.partition] = up
		}
		if !up {
			continue
		}
		present := slices.Sorted(maps.Keys(run.ranks))
		ev := Event{Event: eventIncomplete, RunID: id, DPSize: size, PresentRanks: present, MissingRanks: missing,
			Detail: fmt.Sprintf("ranks %v of dp.size %d did not arrive within %v of the first rank", missing, size, c.cfg.RankTimeout)}
		c.log.Error("benchmark run incomplete", "run_id", id, "missing_ranks", missing, "present_ranks", present, "dp_size", size, "rank_timeout", c.cfg.RankTimeout)
		if err := c.finish(ctx, run, ev, nil); err != nil {
			c.log.Warn("reporting the incomplete run failed; retrying", "run_id", id, "error", err)
		}
	}
}

// mergeRun merges a run whose ranks are all held. A rejection is final; any other error is retried.
func (c *stage) mergeRun(ctx context.Context, run *pendingRun) error {
	spool := filepath.Join(c.cfg.SpoolDir, streams.EncodeToken(run.runID))
	spooled := false // the run's spool directory is made and checked: only then is it removed after the merge
	defer func() {
		if spooled {
			removeSpool(spool)
		}
	}()
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
			if !spooled {
				if err := ensureSpool(c.cfg.SpoolDir, spool); err != nil {
					return err
				}
				spooled = true
			}
			path := filepath.Join(spool, strconv.Itoa(r)+".json")
			if err := c.fetchToFile(ctx, h, path); err != nil {
				// A body that does not match its digest, or whose object is gone, can never be merged.
				if errors.Is(err, benchstore.ErrDigestMismatch) || errors.Is(err, jetstream.ErrObjectNotFound) {
					return c.reject(ctx, run, &RejectError{RunID: run.runID, Rank: intp(r), Rule: RuleMalformedJSON, File: h.file, Detail: err.Error()})
				}
				return err
			}
			rf.Load = func() ([]byte, error) {
				data, _, err := fsutil.ReadRegular(path)
				return data, err
			}
		}
		files = append(files, rf)
	}
	probes, err := c.readProbes(ctx, run.runID)
	if err != nil {
		return err
	}
	out := expandPath(c.cfg.Output, run.runID)
	res, err := Merge(files, probes, Options{MergedPath: out, RequireAllRanks: true, MaxArtefactSize: c.cfg.MaxArtefactSize})
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

func (c *stage) reject(ctx context.Context, run *pendingRun, rej *RejectError) error {
	if rej.RunID == "" {
		rej.RunID = run.runID
	}
	c.log.Error("benchmark run rejected", rej.LogAttrs()...)
	ev := Event{Event: EventRejected, RunID: run.runID, Rank: rej.Rank, Point: rej.Point, Rule: rej.Rule, Detail: rej.Detail, File: rej.File}
	return c.finish(ctx, run, ev, nil)
}

// finish publishes a run's outcome event, acks its messages and forgets it.
func (c *stage) finish(ctx context.Context, run *pendingRun, ev Event, probe *probeContext) error {
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
			m.Done()
		}
	}
	c.done[run.runID] = d
	delete(c.runs, run.runID)
	return nil
}

func (c *stage) publishEvent(ctx context.Context, subject, msgID string, ev Event) error {
	if p, err := c.group.PartitionOf(streams.BenchProbeSubject(ev.RunID)); err == nil {
		ev.ConsumerPartition = fmt.Sprintf("%d/%d", p, c.group.Partitions)
	}
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
	c.outcomes.WithLabelValues(ev.Event).Inc()
	if c.onEvent != nil {
		c.onEvent(ev)
	}
	return nil
}

func (c *stage) publishMerged(ctx context.Context, run *pendingRun, res *result, digest string) error {
	m := benchstore.BenchMerged{RunID: run.runID, Path: res.MergedPath, Digest: digest, RankDigests: map[int]string{}}
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

func (c *stage) publishSidecar(ctx context.Context, runID, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, err = c.store.PublishSidecar(ctx, runID, path, data)
	return err
}

// refreshSidecar recomputes a merged run's sidecar from every probe reply on the stream.
func (c *stage) refreshSidecar(ctx context.Context, runID string, pc *probeContext) error {
	probes, err := c.readProbes(ctx, runID)
	if err != nil {
		return err
	}
	if err := writeSidecar(pc.WorkerProbePath, buildSidecar(*pc, probes)); err != nil {
		return err
	}
	c.log.Info("worker-probe sidecar rewritten for late probe replies", "run_id", runID, "sidecar", pc.WorkerProbePath, "batches", len(probes))
	return c.publishSidecar(ctx, runID, pc.WorkerProbePath)
}

// ensureSpool makes the spool directory and a run's directory in it, or checks the ones there: each
// must be a directory itself, not a symbolic link to one. The spool's default is under /tmp, where
// anyone may plant a link under its name: rank bodies would be written wherever it points, and the
// removal after the merge would remove only the link. Directories made here are the merger's alone.
func ensureSpool(spoolDir, runDir string) error {
	if err := fsutil.EnsureDir(spoolDir, 0o700); err != nil {
		return fmt.Errorf("merge: spool directory: %w", err)
	}
	if err := fsutil.EnsureDir(runDir, 0o700); err != nil {
		return fmt.Errorf("merge: spool directory of the run: %w", err)
	}
	return nil
}

// removeSpool removes a run's spool directory and the rank bodies in it. os.RemoveAll follows no
// symbolic link inside it; one swapped in for the directory itself since ensureSpool checked it is
// not the merger's and is left as it is.
func removeSpool(dir string) {
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
		_ = os.RemoveAll(dir)
	}
}

func (c *stage) fetchToFile(ctx context.Context, h *heldRank, path string) error {
	f, err := fsutil.CreateRegular(path, 0o644) // never through a link planted in the spool directory
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
func (c *stage) readProbes(ctx context.Context, runID string) ([]ProbeReplies, error) {
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
		size, _ := strconv.ParseInt(raw.Header.Get(streams.HeaderBenchSize), 10, 64)
		if err := streams.CheckArtefactSize(fmt.Sprintf("probe replies %s seq %d", subj, raw.Sequence), size, c.cfg.MaxArtefactSize); err != nil {
			c.log.Error("skipping probe replies over the maximum artefact size", "run_id", runID, "seq", raw.Sequence, "error", err)
			continue
		}
		data, err := c.store.Fetch(ctx, raw.Header, raw.Data)
		if err != nil {
			c.log.Warn("skipping unreadable probe replies", "run_id", runID, "seq", raw.Sequence, "error", err)
			continue
		}
		pr, err := parseProbeReplies(data, fmt.Sprintf("%s seq %d", streams.StreamBench, raw.Sequence))
		if err != nil {
			c.log.Warn("skipping malformed probe replies", "run_id", runID, "seq", raw.Sequence, "error", err)
			continue
		}
		out = append(out, pr)
	}
}

// lookupDone returns the outcome of a run already merged, rejected or reported incomplete (nil when the
// run is open), from memory or from the streams.
func (c *stage) lookupDone(ctx context.Context, runID string) (*doneRun, error) {
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
			var pc probeContext
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
