package seal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// DefaultDurable is the sealer's durable consumer on FPM_BENCH.
const DefaultDurable = "fpmbus-seal"

// ConsumerConfig configures the durable sealer. Zero values take the defaults noted.
type ConsumerConfig struct {
	Durable      string        // [DefaultDurable]
	AllowPartial bool          // seal the passed cells of a run whose cells are not all valid
	ProfileWait  time.Duration // how long after the merged artefact its profile may still arrive [10m]
	AckWait      time.Duration // [2m]
	Streams      streams.Config
	Logger       *slog.Logger
	// OnOutcome, when set, is called with each run's report and error (tests).
	OnOutcome func(runID string, rep *Report, err error)
}

// Consumer is the durable sealer behind `fpmbus seal`: it reads merged artefacts from
// fpmbench.merged.>, builds the run's cell from the artefact and the run's collection profile, and
// publishes it with PublishDataset. It is stateless: any number of instances may share the durable
// (or run their own); first-writer-wins rests on the bucket's compare-and-set alone. A message is acked
// once its outcome is final (sealed, idempotent, conflict, rejected, partial); an unknown outcome or a
// profile that has not arrived yet is nakked and redelivered.
type Consumer struct {
	js     jetstream.JetStream
	sealer *Sealer
	store  *streams.BenchStore
	cfg    ConsumerConfig
	log    *slog.Logger

	quit      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

// NewConsumer returns a Consumer sealing with s.
func NewConsumer(js jetstream.JetStream, s *Sealer, cfg ConsumerConfig) (*Consumer, error) {
	if cfg.Durable == "" {
		cfg.Durable = DefaultDurable
	}
	if cfg.ProfileWait == 0 {
		cfg.ProfileWait = 10 * time.Minute
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 2 * time.Minute
	}
	if cfg.Streams.Replicas == 0 {
		cfg.Streams = streams.DefaultConfig()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ProfileWait < 0 || cfg.AckWait < time.Second {
		return nil, fmt.Errorf("seal: profile wait %v must be >= 0 and ack wait %v >= 1s", cfg.ProfileWait, cfg.AckWait)
	}
	return &Consumer{js: js, sealer: s, store: streams.NewBenchStore(js, 0, cfg.Streams), cfg: cfg, log: cfg.Logger,
		quit: make(chan struct{}), stopped: make(chan struct{})}, nil
}

// Run consumes until ctx ends or Close is called.
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
	if _, err := streams.Ensure(ctx, c.js, c.cfg.Streams, c.log); err != nil {
		return err
	}
	bench, err := c.js.Stream(ctx, streams.StreamBench)
	if err != nil {
		return fmt.Errorf("seal: stream %s: %w", streams.StreamBench, err)
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, streams.StreamBench, jetstream.ConsumerConfig{
		Durable:        c.cfg.Durable,
		Description:    "fpmbus dataset sealer: merged artefacts to FPM_DATASETS",
		FilterSubjects: []string{streams.BenchMergedWildcard},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.cfg.AckWait,
		MaxDeliver:     -1,
	})
	if err != nil {
		return fmt.Errorf("seal: consumer %s: %w", c.cfg.Durable, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(16))
	if err != nil {
		return fmt.Errorf("seal: consume: %w", err)
	}
	go func() { <-ctx.Done(); it.Stop() }()
	c.log.Info("sealer started", "durable", c.cfg.Durable, "allow_partial", c.cfg.AllowPartial)
	for {
		m, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				c.log.Info("sealer stopped")
				return nil
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		c.handle(ctx, bench, m)
	}
}

// Close stops Run and waits for it, or for ctx.
func (c *Consumer) Close(ctx context.Context) error {
	c.closeOnce.Do(func() { close(c.quit) })
	select {
	case <-c.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("seal: close: %w", ctx.Err())
	}
}

func (c *Consumer) handle(ctx context.Context, bench jetstream.Stream, m jetstream.Msg) {
	hdr := m.Headers()
	runID := hdr.Get(streams.HeaderBenchRun)
	log := c.log.With("run_id", runID, "subject", m.Subject())
	body, err := c.store.Fetch(ctx, hdr, m.Data())
	if err != nil {
		log.Warn("merged artefact not readable, retrying", "error", err)
		_ = m.NakWithDelay(5 * time.Second)
		return
	}
	pm, err := bench.GetLastMsgForSubject(ctx, streams.BenchProfileSubject(runID))
	if err != nil {
		md, _ := m.Metadata()
		if errors.Is(err, jetstream.ErrMsgNotFound) && md != nil && time.Since(md.Timestamp) > c.cfg.ProfileWait {
			log.Error("no collection profile for the run: not sealed", "subject", streams.BenchProfileSubject(runID), "waited", c.cfg.ProfileWait)
			c.outcome(runID, nil, fmt.Errorf("seal: run %q has no collection profile on %s", runID, streams.BenchProfileSubject(runID)))
			_ = m.Term()
			return
		}
		log.Info("waiting for the run's collection profile", "subject", streams.BenchProfileSubject(runID), "error", err)
		_ = m.NakWithDelay(5 * time.Second)
		return
	}
	prof, err := schemas.DecodeProfile(bytes.NewReader(pm.Data))
	if err != nil {
		log.Error("collection profile invalid: not sealed", "error", err)
		c.outcome(runID, nil, err)
		_ = m.Term()
		return
	}
	ds, err := FromMerged(body, hdr.Get(streams.HeaderBenchSHA256), prof)
	if err != nil {
		log.Error("merged artefact not sealable", "error", err)
		c.outcome(runID, nil, err)
		_ = m.Term()
		return
	}
	rep, err := c.sealer.PublishDataset(ctx, ds, PublishOptions{AllowPartial: c.cfg.AllowPartial})
	var verr schemas.ValidationErrors
	switch {
	case err == nil:
		log.Info("run sealed", "cells", len(rep.Cells), "campaign", rep.CampaignID)
	case errors.As(err, &verr), errors.Is(err, ErrConflict), errors.Is(err, ErrPartial), errors.Is(err, ErrIncomplete):
		log.Warn("run not fully sealed", "error", err)
	default:
		log.Warn("seal outcome unknown, retrying", "error", err)
		_ = m.NakWithDelay(2 * time.Second)
		return
	}
	c.outcome(runID, rep, err)
	_ = m.Ack()
}

func (c *Consumer) outcome(runID string, rep *Report, err error) {
	if c.cfg.OnOutcome != nil {
		c.cfg.OnOutcome(runID, rep, err)
	}
}
