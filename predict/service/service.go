package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/streams"
)

// Names and subjects of the service (see the package comment for why the root is not fpm).
const (
	Name              = "fpm-predict"
	Version           = "1.0.0"
	SubjectRoot       = "fpmpredict"
	SubjectWildcard   = SubjectRoot + ".>"
	SubjectPredict    = SubjectRoot + ".predict"
	SubjectCells      = SubjectRoot + ".cells"
	DefaultQueueGroup = "fpm-predict"
	// MaxBatch bounds the queries of one array request.
	MaxBatch = 10000
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("service: invalid config")

// Config configures a Service. The zero value serves with the defaults.
type Config struct {
	// QueueGroup is the queue group every instance's endpoints join (default DefaultQueueGroup).
	QueueGroup string
	// RequireComplete refuses cells whose campaign is not complete (predict.Options).
	RequireComplete bool
}

// Option configures a Service beyond its Config; an invalid option makes New fail.
type Option func(*Service) error

// WithLogger logs loads, corrupt cells and the service's start and stop (default slog.Default(), as
// every fpmbus component).
func WithLogger(l *slog.Logger) Option {
	return func(s *Service) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidConfig)
		}
		s.log = l
		return nil
	}
}

// Service answers predict queries on NATS from a watched FPM_DATASETS. Run serves until its context
// ends; one Service runs once.
type Service struct {
	nc      *nats.Conn
	kv      jetstream.KeyValue
	cfg     Config
	log     *slog.Logger
	catalog *Catalog
	ready   chan struct{}
	svc     atomic.Pointer[micro.Service]
	counts  *counters
}

// New returns a service answering from kv (the FPM_DATASETS bucket) on nc. It does not close nc.
func New(cfg Config, nc *nats.Conn, kv jetstream.KeyValue, opts ...Option) (*Service, error) {
	if nc == nil || kv == nil {
		return nil, fmt.Errorf("%w: a connection and the bucket are required", ErrInvalidConfig)
	}
	if cfg.QueueGroup == "" {
		cfg.QueueGroup = DefaultQueueGroup
	}
	for _, c := range cfg.QueueGroup {
		if c == ' ' || c == '>' || c == '*' || c == '\t' {
			return nil, fmt.Errorf("%w: queue group %q: no spaces or wildcards", ErrInvalidConfig, cfg.QueueGroup)
		}
	}
	s := &Service{nc: nc, kv: kv, cfg: cfg, log: slog.Default(), ready: make(chan struct{}), counts: newCounters()}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.catalog = NewCatalog(s.log)
	return s, nil
}

// Ready is closed once the bucket is loaded and the endpoints are subscribed.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Snapshot is the bucket the service answers from now.
func (s *Service) Snapshot() *predict.Snapshot { return s.catalog.Snapshot() }

// Micro is the running micro service (nil before Ready): its Info and Stats.
func (s *Service) Micro() micro.Service {
	if p := s.svc.Load(); p != nil {
		return *p
	}
	return nil
}

// Run loads the bucket, registers the micro service and its endpoints, and serves until ctx ends;
// then it stops the service (its subscriptions drain: requests being handled are answered) and the
// watch, and returns nil. A failed watch stops the service and is returned.
func (s *Service) Run(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchErr := make(chan error, 1)
	go func() { watchErr <- s.catalog.Run(wctx, s.kv) }()
	select {
	case <-s.catalog.Loaded():
	case err := <-watchErr:
		return err
	case <-ctx.Done():
		cancel()
		return <-watchErr
	}
	snap := s.catalog.Snapshot()
	s.log.Info("FPM_DATASETS loaded", "cells", len(snap.Cells()), "revision", snap.Revision())
	svc, err := s.register()
	if err != nil {
		cancel()
		<-watchErr
		return err
	}
	// Ready means the server has the subscriptions: a request sent by anyone after Ready finds them.
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = svc.Stop()
		cancel()
		<-watchErr
		return fmt.Errorf("service: flush subscriptions: %w", err)
	}
	s.svc.Store(&svc)
	close(s.ready)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-watchErr:
		watchErr = nil
	}
	stopErr := svc.Stop()
	cancel()
	if watchErr != nil {
		runErr = <-watchErr
	}
	return errors.Join(runErr, stopErr)
}

func (s *Service) register() (micro.Service, error) {
	meta := map[string]string{"bucket": streams.BucketDatasets, "source": predict.Source,
		"require_complete": fmt.Sprint(s.cfg.RequireComplete)}
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:         Name,
		Version:      Version,
		Description:  "fpmbus whole-forward latency estimator over the sealed FPM cells of KV FPM_DATASETS",
		Metadata:     meta,
		QueueGroup:   s.cfg.QueueGroup,
		StatsHandler: s.endpointStats,
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			s.log.Warn("predict service subscription error", "subject", e.Subject, "error", e.Description)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("service: add micro service: %w", err)
	}
	for _, ep := range []struct {
		name, subject, doc string
		h                  micro.HandlerFunc
	}{
		{"predict", SubjectPredict, "query in, answer out (JSON); an array in, an array out", s.handlePredict},
		{"cells", SubjectCells, "the loaded cells and the bucket revision", s.handleCells},
	} {
		if err := svc.AddEndpoint(ep.name, ep.h, micro.WithEndpointSubject(ep.subject),
			micro.WithEndpointMetadata(map[string]string{"description": ep.doc, "format": "application/json"})); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("service: add endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}

// handlePredict answers a query object, or an array of them. A request that is not a query (bad JSON,
// unknown fields) gets the refused answer as its body and a service error (code 400), so it counts
// in the endpoint's errors; a refusal of a well-formed query is an answer, not an error.
func (s *Service) handlePredict(req micro.Request) {
	snap := s.catalog.Snapshot()
	opts := predict.Options{RequireComplete: s.cfg.RequireComplete}
	data := bytes.TrimSpace(req.Data())
	if len(data) > 0 && data[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(data, &raws); err != nil || len(raws) > MaxBatch {
			if err == nil {
				err = fmt.Errorf("%d queries, at most %d per request", len(raws), MaxBatch)
			}
			s.respondInvalid(req, err)
			return
		}
		answers := make([]predict.Answer, len(raws))
		for i, raw := range raws {
			answers[i] = s.answer(snap, raw, opts)
		}
		s.respond(req, answers)
		return
	}
	q, err := predict.DecodeQuery(data)
	if err != nil {
		s.respondInvalid(req, err)
		return
	}
	a := snap.Predict(q, opts)
	s.counts.count(&a)
	s.respond(req, a)
}

func (s *Service) answer(snap *predict.Snapshot, raw []byte, opts predict.Options) predict.Answer {
	q, err := predict.DecodeQuery(raw)
	a := predict.InvalidQuery(err)
	if err == nil {
		a = snap.Predict(q, opts)
	}
	s.counts.count(&a)
	return a
}

func (s *Service) respondInvalid(req micro.Request, err error) {
	a := predict.InvalidQuery(err)
	s.counts.count(&a)
	body, _ := json.Marshal(a)
	_ = req.Error("400", "invalid query: "+err.Error(), body)
}

func (s *Service) respond(req micro.Request, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		_ = req.Error("500", "encode answer: "+err.Error(), nil)
		return
	}
	if err := req.Respond(body); err != nil {
		s.log.Warn("predict service could not respond", "error", err)
	}
}

// CellsReply is the body of a reply on SubjectCells.
type CellsReply struct {
	Revision uint64                `json:"revision"`
	Cells    []predict.CellSummary `json:"cells"`
}

func (s *Service) handleCells(req micro.Request) {
	snap := s.catalog.Snapshot()
	s.respond(req, CellsReply{Revision: snap.Revision(), Cells: snap.Summaries()})
}

// EndpointData is the endpoint-specific part of `nats micro stats`: the bucket served and the answers
// given by status and refusal reason since the start.
type EndpointData struct {
	Revision     uint64           `json:"revision"`
	Cells        int              `json:"cells"`
	CorruptCells int              `json:"corrupt_cells"`
	Answers      map[string]int64 `json:"answers,omitempty"`
	Refusals     map[string]int64 `json:"refusals,omitempty"`
}

func (s *Service) endpointStats(e *micro.Endpoint) any {
	snap := s.catalog.Snapshot()
	d := EndpointData{Revision: snap.Revision()}
	for _, c := range snap.Cells() {
		d.Cells++
		if !c.Valid() {
			d.CorruptCells++
		}
	}
	if e.Subject == SubjectPredict {
		d.Answers, d.Refusals = s.counts.snapshot()
	}
	return d
}

// counters count answers by status and refusal reason, without a lock on the request path.
type counters struct {
	status map[string]*atomic.Int64
	reason map[predict.Reason]*atomic.Int64
}

func newCounters() *counters {
	c := &counters{status: map[string]*atomic.Int64{}, reason: map[predict.Reason]*atomic.Int64{}}
	for _, st := range []string{predict.StatusMeasured, predict.StatusInterpolated, predict.StatusComposed, predict.StatusRefused} {
		c.status[st] = new(atomic.Int64)
	}
	for _, r := range predict.Reasons {
		c.reason[r] = new(atomic.Int64)
	}
	return c
}

func (c *counters) count(a *predict.Answer) {
	if n := c.status[a.Status]; n != nil {
		n.Add(1)
	}
	if a.Refusal != nil {
		if n := c.reason[a.Refusal.Reason]; n != nil {
			n.Add(1)
		}
	}
}

func (c *counters) snapshot() (map[string]int64, map[string]int64) {
	st, rs := map[string]int64{}, map[string]int64{}
	for k, v := range c.status {
		if n := v.Load(); n > 0 {
			st[k] = n
		}
	}
	for k, v := range c.reason {
		if n := v.Load(); n > 0 {
			rs[string(k)] = n
		}
	}
	return st, rs
}
