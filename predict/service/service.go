package service

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/streams"
)

// Names and subjects of the service (see the package comment for why the root is not fpm).
const (
	Name              = "fpm-predict"
	version           = "1.0.0"
	subjectRoot       = "fpmpredict"
	subjectWildcard   = subjectRoot + ".>"
	SubjectPredict    = subjectRoot + ".predict"
	SubjectCells      = subjectRoot + ".cells"
	DefaultQueueGroup = "fpm-predict"
	// MaxBatch bounds the queries of one array request (their answers must also fit one reply).
	MaxBatch = 10000
	// DefaultQueueSize is Config.QueueSize's default.
	DefaultQueueSize = 64
	// DefaultMaxRequestBytes is Config.MaxRequestBytes's default.
	DefaultMaxRequestBytes = 1 << 20
)

// errInvalidConfig wraps every configuration error.
var errInvalidConfig = errors.New("service: invalid config")

// Config configures a Service. The zero value serves with the defaults.
type Config struct {
	// QueueGroup is the queue group every instance's endpoints join (default DefaultQueueGroup).
	QueueGroup string
	// RequireComplete refuses cells whose campaign is not complete (predict.Options).
	RequireComplete bool
	// Workers is how many requests are answered at once (default DefaultWorkers()).
	Workers int
	// QueueSize bounds the requests waiting for a worker (default DefaultQueueSize); a request that
	// finds the queue full is answered at once with a busy error (503).
	QueueSize int
	// MaxRequestBytes bounds a request's body (default DefaultMaxRequestBytes); a larger one is
	// refused unread (413), before it takes a place in the queue.
	MaxRequestBytes int
}

// DefaultWorkers is Config.Workers's default: one per CPU the process may use (GOMAXPROCS).
func DefaultWorkers() int { return runtime.GOMAXPROCS(0) }

func (c Config) withDefaults() Config {
	c.QueueGroup = cmp.Or(c.QueueGroup, DefaultQueueGroup)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers())
	c.QueueSize = cmp.Or(c.QueueSize, DefaultQueueSize)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	return c
}

// Validate reports whether c, with its defaults, is usable; errors wrap errInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := invalid.Reporter(errInvalidConfig)
	for _, ch := range c.QueueGroup {
		if ch == ' ' || ch == '>' || ch == '*' || ch == '\t' {
			return bad("queue group %q: no spaces or wildcards", c.QueueGroup)
		}
	}
	switch {
	case c.Workers < 1:
		return bad("workers %d: want at least 1", c.Workers)
	case c.QueueSize < 1:
		return bad("queue size %d: want at least 1", c.QueueSize)
	case c.MaxRequestBytes < 1:
		return bad("max request bytes %d: want at least 1", c.MaxRequestBytes)
	}
	return nil
}

// option configures a Service beyond its Config; an invalid option makes New fail.
type option func(*Service) error

// withLogger logs loads, corrupt cells and the service's start and stop (default slog.Default(), as
// every fpmbus component).
func withLogger(l *slog.Logger) option {
	return func(s *Service) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", errInvalidConfig)
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
	catalog *catalog
	ready   chan struct{}
	svc     atomic.Pointer[micro.Service]
	counts  *counters
	pool    *pool
	reg     prometheus.Registerer // WithRegisterer; nil: no metrics
}

// New returns a service answering from kv (the FPM_DATASETS bucket) on nc. It does not close nc.
func New(cfg Config, nc *nats.Conn, kv jetstream.KeyValue, opts ...option) (*Service, error) {
	if nc == nil || kv == nil {
		return nil, fmt.Errorf("%w: a connection and the bucket are required", errInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{nc: nc, kv: kv, cfg: cfg, log: slog.Default(), ready: make(chan struct{}), counts: newCounters()}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	s.catalog = newCatalog(s.log)
	if s.reg != nil {
		if err := s.reg.Register(collector{s}); err != nil {
			return nil, fmt.Errorf("%w: register metrics: %v", errInvalidConfig, err)
		}
	}
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

// Run loads the bucket, starts the workers, registers the micro service and its endpoints, and
// serves until ctx ends; then it stops the service (its subscriptions drain: requests being handled
// and queued are answered) and the watch, and returns nil. A failed watch stops the service and is
// returned.
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
	s.pool = startPool(s.cfg.Workers, s.cfg.QueueSize)
	svc, err := s.register()
	if err != nil {
		s.pool.stop()
		cancel()
		<-watchErr
		return err
	}
	// Ready means the server has the subscriptions: a request sent by anyone after Ready finds them.
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = svc.Stop()
		s.pool.stop()
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
	// Requests still arriving while the subscriptions drain are answered on their delivery goroutine.
	s.pool.stop()
	stopErr := svc.Stop()
	cancel()
	if watchErr != nil {
		runErr = <-watchErr
	}
	return errors.Join(runErr, stopErr)
}

func (s *Service) register() (micro.Service, error) {
	meta := map[string]string{"bucket": streams.BucketDatasets, "source": predict.Source,
		"require_complete": fmt.Sprint(s.cfg.RequireComplete), "workers": strconv.Itoa(s.cfg.Workers),
		"queue_size": strconv.Itoa(s.cfg.QueueSize), "max_request_bytes": strconv.Itoa(s.cfg.MaxRequestBytes)}
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:         Name,
		Version:      version,
		Description:  "fpmbus whole-forward latency estimator over the sealed FPM cells of KV FPM_DATASETS",
		Metadata:     meta,
		QueueGroup:   s.cfg.QueueGroup,
		StatsHandler: s.endpointStats,
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			s.log.Warn("predict service subscription error", "subject", e.Subject, "error", predict.Bounded(e.Description))
		},
	})
	if err != nil {
		return nil, fmt.Errorf("service: add micro service: %w", err)
	}
	for _, ep := range []struct {
		name, subject, doc string
		h                  func(*request)
	}{
		{"predict", SubjectPredict, "query in, answer out (JSON); an array in, an array out", s.handlePredict},
		{"cells", SubjectCells, `the loaded cells and the bucket revision, as many as one reply holds; {"after": KEY} continues`, s.handleCells},
	} {
		if err := svc.AddEndpoint(ep.name, s.admit(ep.h), micro.WithEndpointSubject(ep.subject),
			micro.WithEndpointMetadata(map[string]string{"description": ep.doc, "format": "application/json"})); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("service: add endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}

// handlePredict answers a query object, or an array of them. A request that is not a query (bad JSON,
// unknown fields) gets the refused answer as its body and a service error (code 400); a refusal of a
// well-formed query is an answer, not an error. The reply fits the connection's max payload: an
// array whose answers do not is refused (413) naming how many of its queries fit one reply.
func (s *Service) handlePredict(r *request) {
	snap := s.catalog.Snapshot()
	opts := predict.Options{RequireComplete: s.cfg.RequireComplete}
	data := bytes.TrimSpace(r.data)
	if len(data) > 0 && data[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(data, &raws); err != nil || len(raws) > MaxBatch {
			if err == nil {
				err = fmt.Errorf("%d queries, at most %d per request", len(raws), MaxBatch)
			}
			s.replyInvalid(r, err)
			return
		}
		s.replyAnswers(r, snap, raws, opts)
		return
	}
	q, err := predict.DecodeQuery(data)
	if err != nil {
		s.replyInvalid(r, err)
		return
	}
	a := snap.Predict(q, opts)
	body, err := json.Marshal(a)
	if err != nil {
		s.replyError(r, codeInternal, "encode answer: "+err.Error(), nil)
		return
	}
	if room := s.room(); len(body) > room {
		fit := 0
		s.replyTooLarge(r, &ErrorReply{Error: fmt.Sprintf("the answer is %d bytes, over the %d a reply holds (the connection's max payload less headers): "+
			"shorten what it echoes of the query (id, identity)", len(body), room), ReplyBytes: len(body), MaxReplyBytes: room, Queries: 1, FitQueries: &fit})
		return
	}
	s.counts.count(&a)
	s.reply(r, body, nil)
}

// replyAnswers answers an array of queries in one array, encoded answer by answer so that a reply
// that would not fit is known, and refused, as soon as it outgrows the room.
func (s *Service) replyAnswers(r *request, snap *predict.Snapshot, raws []json.RawMessage, opts predict.Options) {
	room := s.room()
	body := make([]byte, 0, min(room, 64<<10))
	body = append(body, '[')
	answers := make([]predict.Answer, 0, len(raws))
	for i, raw := range raws {
		q, err := predict.DecodeQuery(raw)
		a := predict.InvalidQuery(err)
		if err == nil {
			a = snap.Predict(q, opts)
		}
		b, err := json.Marshal(a)
		if err != nil {
			s.replyError(r, codeInternal, "encode answer: "+err.Error(), nil)
			return
		}
		if len(body)+1+len(b)+1 > room {
			fit := i
			msg := fmt.Sprintf("the answers to %d queries do not fit one reply of %d bytes (the connection's max payload less headers): "+
				"the first %d do; send at most %d queries per request", len(raws), room, i, i)
			if i == 0 {
				msg = fmt.Sprintf("the answer to the first of %d queries alone is %d bytes, over the %d a reply holds: shorten what it echoes of the query (id, identity)",
					len(raws), len(b), room)
			}
			s.replyTooLarge(r, &ErrorReply{Error: msg, ReplyBytes: len(body) + 1 + len(b) + 1, MaxReplyBytes: room, Queries: len(raws), FitQueries: &fit})
			return
		}
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, b...)
		answers = append(answers, a)
	}
	body = append(body, ']')
	for i := range answers {
		s.counts.count(&answers[i])
	}
	s.reply(r, body, nil)
}

// cellsReply is the body of a reply on SubjectCells: the loaded cells in key order from the first
// (or the first after the request's "after"), as many as one reply holds; Next, when set, is the
// "after" that continues the list.
type cellsReply struct {
	Revision uint64                `json:"revision"`
	Cells    []predict.CellSummary `json:"cells"`
	Next     string                `json:"next,omitempty"`
}

// cellsRequest is the body of a request on SubjectCells (an empty body: from the first cell).
type cellsRequest struct {
	After string `json:"after,omitempty"`
}

func (s *Service) handleCells(r *request) {
	var cr cellsRequest
	if data := bytes.TrimSpace(r.data); len(data) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cr); err != nil {
			s.replyError(r, codeInvalid, predict.Bounded(`invalid cells request: want an empty body or {"after": KEY}: `+err.Error()), nil)
			return
		}
	}
	snap := s.catalog.Snapshot()
	room := s.room()
	out := cellsReply{Revision: snap.Revision(), Cells: []predict.CellSummary{}}
	head, _ := json.Marshal(out)
	size := len(head)
	for _, c := range snap.Summaries() {
		if c.Key <= cr.After {
			continue
		}
		b, _ := json.Marshal(c)
		if len(b) > room/2 { // a summary that would crowd out every other (an identity of megabytes)
			c = predict.CellSummary{Key: c.Key, Revision: c.Revision, Valid: c.Valid, PrefillRows: c.PrefillRows, DecodeRows: c.DecodeRows,
				Problems: []string{fmt.Sprintf("summary of %d bytes cut to its key and counts", len(b))}}
			b, _ = json.Marshal(c)
		}
		key, _ := json.Marshal(c.Key)
		// With room for "next" naming this cell, in case the one after it does not fit.
		if size+1+len(b)+len(`,"next":`)+len(key) > room && len(out.Cells) > 0 {
			out.Next = out.Cells[len(out.Cells)-1].Key
			break
		}
		size += 1 + len(b)
		out.Cells = append(out.Cells, c)
	}
	body, err := json.Marshal(out)
	if err != nil {
		s.replyError(r, codeInternal, "encode cells: "+err.Error(), nil)
		return
	}
	s.reply(r, body, nil)
}
