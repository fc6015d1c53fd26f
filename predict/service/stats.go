package service

import (
	"sync/atomic"

	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/predict"
)

// What `nats micro stats fpm-predict` shows beyond micro's own figures. micro counts every request an
// endpoint receives (num_requests); the answers and the error replies are counted here, since they are
// sent by the workers, which micro does not see (its num_errors and processing time cover only the
// handing over to a worker).

// EndpointData is the endpoint-specific part of `nats micro stats`: the bucket served, the answers given
// by status and refusal reason (predict) and the error replies by code since the start, and the worker
// pool.
type EndpointData struct {
	Revision     uint64           `json:"revision"`
	Cells        int              `json:"cells"`
	CorruptCells int              `json:"corrupt_cells"`
	Answers      map[string]int64 `json:"answers,omitempty"`
	Refusals     map[string]int64 `json:"refusals,omitempty"`
	// Errors counts the error replies by code: 400 not a query, 413 a request or a reply too large,
	// 503 busy, 500 an answer that could not be encoded.
	Errors map[string]int64 `json:"errors,omitempty"`
	// Workers and QueueSize are the pool's; Queued is how many requests wait for a worker now.
	Workers   int `json:"workers"`
	QueueSize int `json:"queue_size"`
	Queued    int `json:"queued"`
}

func (s *Service) endpointStats(e *micro.Endpoint) any {
	snap := s.catalog.Snapshot()
	d := EndpointData{Revision: snap.Revision(), Workers: s.cfg.Workers, QueueSize: s.cfg.QueueSize, Queued: s.pool.queued()}
	for _, c := range snap.Cells() {
		d.Cells++
		if !c.Valid() {
			d.CorruptCells++
		}
	}
	if e.Subject == SubjectPredict {
		d.Answers, d.Refusals = s.counts.snapshot()
	}
	d.Errors = s.counts.errorsOf(e.Subject)
	return d
}

// Error reply codes (the micro service error header Nats-Service-Error-Code).
const (
	codeInvalid  = "400"
	codeTooLarge = "413"
	codeInternal = "500"
	codeBusy     = "503"
)

var codes = []string{codeInvalid, codeTooLarge, codeInternal, codeBusy}

// counters count answers by status and refusal reason, and error replies by endpoint and code, without
// a lock on the request path.
type counters struct {
	status map[string]*atomic.Int64
	reason map[predict.Reason]*atomic.Int64
	errors map[string]map[string]*atomic.Int64 // endpoint subject -> code
}

func newCounters() *counters {
	c := &counters{status: map[string]*atomic.Int64{}, reason: map[predict.Reason]*atomic.Int64{}, errors: map[string]map[string]*atomic.Int64{}}
	for _, st := range []string{predict.StatusMeasured, predict.StatusInterpolated, predict.StatusComposed, predict.StatusRefused} {
		c.status[st] = new(atomic.Int64)
	}
	for _, r := range predict.Reasons {
		c.reason[r] = new(atomic.Int64)
	}
	for _, subj := range []string{SubjectPredict, SubjectCells} {
		c.errors[subj] = map[string]*atomic.Int64{}
		for _, code := range codes {
			c.errors[subj][code] = new(atomic.Int64)
		}
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

// fail counts an error reply of code on the endpoint subject.
func (c *counters) fail(subject, code string) {
	if n := c.errors[subject][code]; n != nil {
		n.Add(1)
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

func (c *counters) errorsOf(subject string) map[string]int64 {
	out := map[string]int64{}
	for code, v := range c.errors[subject] {
		if n := v.Load(); n > 0 {
			out[code] = n
		}
	}
	return out
}
