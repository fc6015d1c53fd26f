package seal

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/consumers/durable"
	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/retrywait"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Defaults of Config.
const (
	DefaultDurable     = "fpmbus-seal"
	defaultPartitions  = durable.DefaultHoldingPartitions
	defaultPinnedTTL   = durable.DefaultPinnedTTL
	defaultProfileWait = 10 * time.Minute
	defaultAckWait     = durable.DefaultHoldingAckWait
)

// ConsumerName names the sealer in the runner's metrics (label consumer) and its dead letters
// (durable.RejectedSubject(ConsumerName) = fpmevents.deadletter.consumer.seal).
const ConsumerName = "seal"

const (
	// tickInterval paces the checks of held messages (profile arrived, unknown outcome retried).
	tickInterval = 250 * time.Millisecond
	// profilePoll is how often a merged artefact waiting for its run's profile looks for it.
	profilePoll = time.Second
	// retryFirst and retryMax bound the pause before an unknown outcome (or an unreadable body) is
	// tried again.
	retryFirst, retryMax = 2 * time.Second, 30 * time.Second
	maxAckPending        = 1000
	batch                = 16
)

// ErrInvalidConfig wraps every Config or option problem of a Consumer.
var ErrInvalidConfig = errors.New("seal: invalid consumer config")

// errNoProfile is the reason a merged artefact is rejected when its run's collection profile did not
// arrive within Config.ProfileWait, or is not a valid profile.
var errNoProfile = errors.New("seal: no valid collection profile for the run")

// Config configures the durable sealer. Zero values take the defaults noted.
type Config struct {
	// HoldingConfig is the sealer's partition group (durable.HoldingConfig): its name (Durable,
	// DefaultDurable), the partitions of the runs (keyed by the run of fpmbench.merged.<run>), pinned
	// TTL, ack wait (held messages are kept alive by the runner), stop timeout and crash-loop bound.
	durable.HoldingConfig
	// AllowPartial seals the passed cells of a run whose cells are not all valid.
	AllowPartial bool
	// ProfileWait is how long after the merged artefact its profile may still arrive [defaultProfileWait].
	ProfileWait time.Duration
	// Streams are applied at start and give the bucket's settings [streams.DefaultConfig()].
	Streams streams.Config
	// MaxArtefactSize is the largest merged artefact read; one whose Fpm-Bench-Size is larger is
	// rejected unread [streams.DefaultBenchMaxArtefact].
	MaxArtefactSize int64
	// Sealer seals the cells [a Sealer with source "fpmbus seal" on FPM_DATASETS, created
	// idempotently by Run with the bucket settings of Streams].
	Sealer *Sealer
	// OutcomeHook, when set, is called on the consumer's loop with each merged artefact's final
	// outcome: its run, the report (nil when nothing was published) and the error.
	OutcomeHook func(runID string, rep *report, err error)
	// Registerer receives the sealer's metrics and its runner's; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the sealer's logs and its runner's [slog.Default()].
	Logger *slog.Logger
}

func (c *Config) fill() error {
	if err := c.HoldingConfig.Fill(DefaultDurable, ErrInvalidConfig); err != nil {
		return err
	}
	c.ProfileWait = cmp.Or(c.ProfileWait, defaultProfileWait)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.MaxArtefactSize = cmp.Or(c.MaxArtefactSize, streams.DefaultBenchMaxArtefact)
	if c.MaxArtefactSize < 0 {
		return fmt.Errorf("%w: max artefact size %d must be positive", ErrInvalidConfig, c.MaxArtefactSize)
	}
	if c.Streams.Replicas == 0 {
		c.Streams = streams.DefaultConfig()
	}
	if c.ProfileWait < 0 {
		return fmt.Errorf("%w: profile wait %v must be >= 0", ErrInvalidConfig, c.ProfileWait)
	}
	return nil
}

// Group is the partition group of the sealer: FPM_BENCH's merged artefacts fpmbench.merged.<run>,
// keyed by the run token.
func (c Config) Group() durable.GroupConfig {
	return c.HoldingConfig.Group(maxAckPending, batch, streams.BenchMergedRoot+".*")
}

// Consumer is the durable sealer behind `fpmbus seal` and `fpmbus up`: a durable.Consumer run by a
// durable.Runner in the partition group Config.Group. It reads merged artefacts from
// fpmbench.merged.<run>, builds the run's cell from the artefact and the run's collection profile, and
// publishes it with PublishDataset. First-writer-wins rests on the bucket's compare-and-set alone, so
// a takeover (or two sealers racing on one run) never seals a cell twice. A message is:
//
//   - done once its outcome is final and recorded in the bucket (sealed, idempotent, conflict,
//     partial, incomplete);
//   - held, and checked again on the runner's tick, while its run's profile has not arrived (up to
//     ProfileWait after the artefact was stored), while the seal's outcome is unknown (a timeout, no
//     leader) or while its body cannot be read for a reason that may pass;
//   - rejected (one dead letter on FPM_EVENTS, never delivered again) when it can never be sealed:
//     a body that is not a merged artefact or does not match its digest, an artefact without an
//     identity, a dataset that fails validation, no valid profile within ProfileWait.
type Consumer struct {
	runner *durable.Runner
	s      *sealStage
}

// sealStage is the durable.Consumer. Every method runs on the runner's loop goroutine.
type sealStage struct {
	js        jetstream.JetStream
	cfg       Config
	log       *slog.Logger
	now       func() time.Time
	store     *benchstore.BenchStore
	sealer    *Sealer
	onOutcome func(runID string, rep *report, err error)
	bench     jetstream.Stream
	held      []*heldSeal // in delivery order
	metrics   *metrics
	who       string // this instance in dataset events (member id, or host-pid)
}

// heldSeal is a merged artefact that is neither done nor rejected yet.
type heldSeal struct {
	m       *durable.Msg
	runID   string
	checked bool // the body was read and is a merged artefact
	retryAt time.Time
	waits   backoff.BackOff // nil until the first retry
}

// New checks cfg and opts and returns a sealer consumer; Run starts it.
// Options: durable.WithMemberID, durable.WithClock (the profile wait and the retries).
func New(cfg Config, js jetstream.JetStream, opts ...durable.Option) (*Consumer, error) {
	o, err := durable.CheckStage(cfg.fill, js, ErrInvalidConfig, opts)
	if err != nil {
		return nil, err
	}
	who := o.MemberID
	if who == "" {
		host, _ := os.Hostname()
		who = host + "-" + strconv.Itoa(os.Getpid())
	}
	s := &sealStage{js: js, cfg: cfg, log: cfg.Logger.With("component", "seal", "group", cfg.Durable), now: o.Clock,
		store: benchstore.NewBenchStore(js, 0, cfg.Streams), sealer: cfg.Sealer, onOutcome: cfg.OutcomeHook, metrics: newMetrics(), who: who}
	if cfg.Registerer != nil {
		if err := s.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("%w: register metrics: %v", ErrInvalidConfig, err)
		}
	}
	rc := cfg.RunnerConfig(ConsumerName, cfg.Group(), tickInterval)
	rc.Logger, rc.Registerer = cfg.Logger.With("component", ConsumerName), cfg.Registerer
	r, err := durable.New(rc, js, s, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return &Consumer{runner: r, s: s}, nil
}

// Ready is closed once Run has prepared the streams and the bucket, joined the group and is taking
// partitions. It is never closed if Run fails before that; wait for Run's result as well.
func (c *Consumer) Ready() <-chan struct{} { return c.runner.Ready() }

// Owned lists the partitions this instance owns now.
func (c *Consumer) Owned() []int { return c.runner.Owned() }

// Run ensures the streams and the bucket exist, joins the group and seals until ctx ends, then stops
// gracefully (held messages go, unacked, to the next owner at once). It returns nil after a requested
// stop.
func (c *Consumer) Run(ctx context.Context) error {
	s := c.s
	if _, err := streams.Ensure(ctx, s.js, s.cfg.Streams, s.log); err != nil {
		return err
	}
	if s.sealer == nil {
		kv, err := OpenBucket(ctx, s.js, s.cfg.Streams)
		if err != nil {
			return err
		}
		if s.sealer, err = NewSealer(kv, WithSource("fpmbus seal")); err != nil {
			return err
		}
	}
	s.sealer = s.sealer.withJetStream(s.js)
	s.protect(ctx)
	var err error
	if s.bench, err = s.js.Stream(ctx, streams.StreamBench); err != nil {
		return fmt.Errorf("seal: stream %s: %w", streams.StreamBench, err)
	}
	s.audit(ctx)
	s.log.Info("sealer starting", "partitions", s.cfg.Partitions, "allow_partial", s.cfg.AllowPartial)
	return c.runner.Run(ctx)
}

// Handle seals a batch of one partition's merged artefacts, holding those that must wait.
func (s *sealStage) Handle(ctx context.Context, batch []*durable.Msg) error {
	for _, m := range batch {
		h := &heldSeal{m: m}
		if s.attempt(ctx, h) {
			s.held = append(s.held, h)
		}
	}
	return nil
}

// Tick tries the held messages whose time has come again.
func (s *sealStage) Tick(ctx context.Context, _ time.Time) error {
	now := s.now()
	s.held = slices.DeleteFunc(s.held, func(h *heldSeal) bool {
		return !now.Before(h.retryAt) && !s.attempt(ctx, h)
	})
	return nil
}

// Close ends the sealer: what it holds stays unacked for the next owner.
func (s *sealStage) Close(context.Context) error {
	s.log.Info("sealer stopped", "held", len(s.held))
	return nil
}

// Assigned needs no state: the sealer's state is the bucket.
func (s *sealStage) Assigned(context.Context, int) error { return nil }

// Release forgets partition p's held messages: they go, unacked, to the next owner.
func (s *sealStage) Release(_ context.Context, p int) error {
	s.Lost(p)
	return nil
}

// Lost forgets partition p's held messages.
func (s *sealStage) Lost(p int) {
	s.held = slices.DeleteFunc(s.held, func(h *heldSeal) bool { return h.m.Partition == p })
}

// attempt takes h as far as it can: done, rejected, or held (true) with its next try set.
func (s *sealStage) attempt(ctx context.Context, h *heldSeal) (held bool) {
	m := h.m
	if h.runID == "" {
		kind, runID, _, err := streams.ParseBenchSubject(m.Subject())
		if err == nil && kind != streams.BenchKindMerged {
			err = fmt.Errorf("%s is a %s subject", m.Subject(), kind)
		}
		if err == nil {
			err = streams.CheckRunID(runID)
		}
		if err == nil {
			size, _ := strconv.ParseInt(m.Headers().Get(streams.HeaderBenchSize), 10, 64)
			err = streams.CheckArtefactSize(fmt.Sprintf("merged artefact %s seq %d", m.Subject(), m.StreamSeq),
				max(size, int64(len(m.Data()))), s.cfg.MaxArtefactSize)
		}
		if err != nil {
			s.reject(m, "", fmt.Errorf("%w: %v", errNotSealable, err))
			return false
		}
		h.runID = runID
	}
	log := s.log.With("run_id", h.runID, "subject", m.Subject(), "stream_seq", m.StreamSeq)
	retry := func(why string, err error) bool {
		if h.waits == nil {
			h.waits = retrywait.Doubling(retryFirst, retryMax)
		}
		wait := h.waits.NextBackOff()
		h.retryAt = s.now().Add(wait)
		log.Warn(why+"; retrying", "retry_in", wait, "error", err)
		return true
	}
	// read fetches the body; when it cannot (ok false) m was rejected or is held for a retry, as held says.
	read := func() (body []byte, ok, held bool) {
		b, final, err := s.fetch(ctx, m)
		switch {
		case final:
			s.reject(m, h.runID, err)
			return nil, false, false
		case err != nil:
			return nil, false, retry("merged artefact not readable", err)
		}
		return b, true, false
	}
	var body []byte
	if !h.checked {
		// Whatever the profile, a body that is not a merged artefact can never be sealed: say so at once.
		b, ok, later := read()
		if !ok {
			return later
		}
		if err := isMerged(b); err != nil {
			s.reject(m, h.runID, err)
			return false
		}
		h.checked, body = true, b
	}
	pm, err := s.bench.GetLastMsgForSubject(ctx, streams.BenchProfileSubject(h.runID))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if waited := s.now().Sub(m.Stored); waited > s.cfg.ProfileWait {
			s.reject(m, h.runID, fmt.Errorf("%w: nothing on %s within %v of the merged artefact", errNoProfile,
				streams.BenchProfileSubject(h.runID), s.cfg.ProfileWait))
			return false
		}
		if h.retryAt.IsZero() {
			log.Info("waiting for the run's collection profile", "profile_subject", streams.BenchProfileSubject(h.runID), "profile_wait", s.cfg.ProfileWait)
		}
		h.retryAt = s.now().Add(profilePoll)
		return true
	case err != nil:
		return retry("collection profile not readable", err)
	}
	prof, err := schemas.DecodeProfile(bytes.NewReader(pm.Data))
	if err != nil {
		s.reject(m, h.runID, fmt.Errorf("%w: %s seq %d: %v", errNoProfile, streams.BenchProfileSubject(h.runID), pm.Sequence, err))
		return false
	}
	if body == nil {
		b, ok, later := read()
		if !ok {
			return later
		}
		body = b
	}
	ds, err := FromMerged(body, m.Headers().Get(streams.HeaderBenchSHA256), prof)
	if err != nil {
		s.reject(m, h.runID, err)
		return false
	}
	rep, err := s.sealer.PublishDataset(ctx, ds, PublishOptions{AllowPartial: s.cfg.AllowPartial})
	var verr schemas.ValidationErrors
	switch {
	case err == nil:
		log.Info("run sealed", "cells", len(rep.Cells), "campaign", rep.CampaignID)
	case errors.As(err, &verr):
		s.outcome(h.runID, rep, err)
		m.Reject(fmt.Errorf("%w: the run's dataset fails validation: %v", errNotSealable, err))
		log.Error("run's dataset rejected: not sealed", "error", err)
		return false
	case errors.Is(err, ErrTooLarge), errors.Is(err, errPlanMismatch):
		// A cell or campaign record the server can never store, a campaign id whose record froze
		// another plan: no retry changes it.
		s.outcome(h.runID, rep, err)
		m.Reject(fmt.Errorf("%w: %v", errNotSealable, err))
		log.Error("run can never be sealed", "error", err)
		return false
	case errors.Is(err, ErrConflict), errors.Is(err, errPartial), errors.Is(err, errIncomplete):
		s.reportRefusals(ctx, err)
		log.Warn("run not fully sealed", "error", err)
	default:
		return retry("seal outcome unknown", err)
	}
	s.outcome(h.runID, rep, err)
	m.Done()
	return false
}

// fetch reads m's body (inline or from the object store) and checks it against its digest. final is
// true when the body can never be read: it does not match its digest, or its object is gone.
func (s *sealStage) fetch(ctx context.Context, m *durable.Msg) (body []byte, final bool, err error) {
	body, err = s.store.Fetch(ctx, m.Headers(), m.Data())
	if errors.Is(err, benchstore.ErrDigestMismatch) || errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, true, fmt.Errorf("%w: %v", errNotSealable, err)
	}
	return body, false, err
}

// isMerged checks that doc is a merged benchmark artefact (a JSON object with artifact_type "merged").
func isMerged(doc []byte) error {
	var head struct {
		ArtifactType any `json:"artifact_type"`
	}
	if err := json.Unmarshal(doc, &head); err != nil {
		return fmt.Errorf("%w: not a JSON object: %v", errNotSealable, err)
	}
	if head.ArtifactType != "merged" {
		return fmt.Errorf("%w: artifact_type %v, want merged", errNotSealable, head.ArtifactType)
	}
	return nil
}

// reject dead-letters m (the runner publishes it with reason and terminates it) and reports the outcome.
func (s *sealStage) reject(m *durable.Msg, runID string, reason error) {
	s.log.Error("merged artefact can never be sealed: dead-lettered", "run_id", runID, "subject", m.Subject(),
		"stream_seq", m.StreamSeq, "reason", reason)
	s.outcome(runID, nil, reason)
	m.Reject(reason)
}

func (s *sealStage) outcome(runID string, rep *report, err error) {
	switch {
	case err == nil:
		s.metrics.runs.WithLabelValues(outcomeSealed).Inc()
	case errors.Is(err, ErrConflict), errors.Is(err, errPartial), errors.Is(err, errIncomplete):
		s.metrics.runs.WithLabelValues(outcomePartial).Inc()
	default:
		s.metrics.runs.WithLabelValues(outcomeRejected).Inc()
	}
	if rep != nil {
		for _, c := range rep.Cells {
			s.metrics.cells.WithLabelValues(c.State).Inc()
		}
	}
	if s.onOutcome != nil {
		s.onOutcome(runID, rep, err)
	}
}

// protect adds the protection FPM_DATASETS lacks (Protect), and reports a bucket it could not protect
// (the credential may not change the stream): an error log naming what is missing and the gauge
// fpmbus_seal_bucket_unprotected. Sealing goes on: what the bucket lacks lets a credential remove
// revisions, not a seal be won twice.
func (s *sealStage) protect(ctx context.Context) {
	_, err := Protect(ctx, s.js, s.log)
	if err != nil {
		s.metrics.unprotected.Set(1)
		s.log.Error("FPM_DATASETS is not protected: a credential that may write it can purge or expire sealed history", "error", err)
		return
	}
	s.metrics.unprotected.Set(0)
}

// audit re-reads the recorded seals (Audit) and reports each cell FPM_DATASETS has lost or holds
// under another run, and each revision no fpmbus writer stores (tampering): an error log, the gauges,
// and a dataset event on FPM_EVENTS. A failed audit is logged; sealing goes on (PublishDataset guards
// each seal against the records itself).
func (s *sealStage) audit(ctx context.Context) {
	rep, err := s.sealer.Audit(ctx)
	if err != nil {
		s.log.Error("audit of the recorded seals failed; cells FPM_DATASETS may have lost are not reported", "error", err)
		return
	}
	s.metrics.missing.Set(float64(rep.Missing()))
	s.metrics.replaced.Set(float64(len(rep.Findings) - rep.Missing()))
	s.metrics.tamperedCells.Set(float64(rep.TamperedKeys(schemas.CellKeyPrefix)))
	s.metrics.tamperedCampaigns.Set(float64(rep.TamperedKeys(schemas.CampaignKeyPrefix)))
	for _, t := range rep.Tampered {
		typ := streams.DatasetCellTampered
		if strings.HasPrefix(t.Key, schemas.CampaignKeyPrefix) {
			typ = streams.DatasetCampaignTampered
		}
		s.log.Error("FPM_DATASETS holds a revision no fpmbus writer stores (tampering); readers ignore it",
			"key", t.Key, "revision", t.Revision, "op", t.Op, "campaign", t.CampaignID, "reason", t.Reason)
		s.publishEvent(ctx, &streams.DatasetEvent{Schema: streams.DatasetEventSchema, Type: typ,
			ID: streams.DatasetTamperMsgID(typ, t.Key, t.Revision), Cell: t.Key, CampaignID: t.CampaignID,
			TamperedRevision: t.Revision, TamperedOp: t.Op, DetectedBy: s.who, DetectedAtMs: s.now().UnixMilli(),
			Summary: fmt.Sprintf("%s revision %d (%s): %s", t.Key, t.Revision, t.Op, t.Reason)})
	}
	for _, key := range rep.CorruptCampaigns {
		s.log.Error("campaign key holds no frozen plan, only revisions no fpmbus writer stores: it names no seal to check", "key", key)
	}
	for _, f := range rep.Findings {
		ev := &streams.DatasetEvent{Schema: streams.DatasetEventSchema, Type: streams.DatasetCellMissing, Cell: f.Cell,
			CampaignID: f.CampaignID, SealedRunID: f.RunID, SealedDatasetDigest: f.DatasetDigest,
			DetectedBy: s.who, DetectedAtMs: s.now().UnixMilli()}
		if f.Missing {
			ev.Summary = fmt.Sprintf("campaign %s records %s sealed by run %q (dataset %s); %s: %s",
				f.CampaignID, f.Cell, f.RunID, f.DatasetDigest, streams.BucketDatasets, f.Reason)
			s.log.Error("sealed cell missing from "+streams.BucketDatasets+"; a different run will be refused while the campaign record names it",
				"cell", f.Cell, "campaign", f.CampaignID, "sealed_run_id", f.RunID, "dataset_digest", f.DatasetDigest, "reason", f.Reason)
		} else {
			ev.Type, ev.FoundRunID, ev.FoundDatasetDigest = streams.DatasetCellReplaced, f.Found.RunID, f.Found.DatasetDigest
			ev.Summary = fmt.Sprintf("campaign %s records %s sealed by run %q (dataset %s); %s holds run %q (dataset %s)",
				f.CampaignID, f.Cell, f.RunID, f.DatasetDigest, streams.BucketDatasets, f.Found.RunID, f.Found.DatasetDigest)
			s.log.Error("sealed cell held by another run than its campaign record names", "cell", f.Cell, "campaign", f.CampaignID,
				"sealed_run_id", f.RunID, "found_run_id", f.Found.RunID, "found_dataset_digest", f.Found.DatasetDigest)
		}
		ev.ID = streams.DatasetEventMsgID(ev.Type, f.Cell, f.CampaignID, f.RunID, "")
		s.publishEvent(ctx, ev)
	}
	s.log.Info("recorded seals audited", "checked", rep.Checked, "missing", rep.Missing(), "replaced", len(rep.Findings)-rep.Missing(),
		"tampered_revisions", len(rep.Tampered))
}

// reportRefusals reports each seal PublishDataset refused because its cell is missing while a
// campaign record names another run's seal: an error log, the counter and a seal_refused event naming
// both runs.
func (s *sealStage) reportRefusals(ctx context.Context, err error) {
	var cs *conflictsError
	if !errors.As(err, &cs) {
		return
	}
	for _, c := range cs.Conflicts {
		if !c.Missing {
			continue
		}
		s.metrics.refusals.Inc()
		s.log.Error("seal refused: the cell is missing from "+streams.BucketDatasets+" but its campaign record names another run's seal",
			"cell", c.Key, "campaign", c.CampaignID, "sealed_run_id", c.Sealed.RunID, "sealed_dataset_digest", c.Sealed.DatasetDigest,
			"refused_run_id", c.Refused.RunID, "refused_dataset_digest", c.Refused.DatasetDigest)
		s.publishEvent(ctx, &streams.DatasetEvent{Schema: streams.DatasetEventSchema, Type: streams.DatasetSealRefused,
			ID:   streams.DatasetEventMsgID(streams.DatasetSealRefused, c.Key, c.CampaignID, c.Sealed.RunID, c.Refused.RunID),
			Cell: c.Key, CampaignID: c.CampaignID, SealedRunID: c.Sealed.RunID, SealedDatasetDigest: c.Sealed.DatasetDigest,
			RefusedRunID: c.Refused.RunID, RefusedDatasetDigest: c.Refused.DatasetDigest, RefusedAttemptID: c.Refused.AttemptID,
			RefusedSource: c.Refused.Source, DetectedBy: s.who, DetectedAtMs: s.now().UnixMilli(), Summary: c.Error()})
	}
}

// publishEvent stores ev on FPM_EVENTS; a failure is logged (the finding is in the log line before it).
func (s *sealStage) publishEvent(ctx context.Context, ev *streams.DatasetEvent) {
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.js.PublishMsg(octx, ev.Msg()); err != nil {
		s.log.Error("dataset event not stored", "type", ev.Type, "cell", ev.Cell, "error", err)
	}
}
