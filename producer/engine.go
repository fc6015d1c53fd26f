package producer

import (
	"math"
	"math/rand/v2"

	"github.com/fpmbus/fpmbus/schemas"
)

// Simulation constants: a mid-size model on one GPU under vLLM V1's default scheduler limits.
const (
	simMaxRunning      = 64     // max_num_seqs
	simMaxBatchTokens  = 2048   // max_num_batched_tokens (chunked prefill budget per step)
	simKVCapacity      = 48_000 // KV cache capacity in tokens
	simBlockSize       = 16     // prefix-cache hits are whole blocks
	simBaseArrivals    = 0.3    // mean arrivals per step
	simLoadPeriod      = 4000   // steps per load cycle (arrival rate swings ±60 %)
	simInitialRequests = 4      // requests waiting before the first step, so it is not empty
	simPrefixHitProb   = 0.35

	// Latency model (seconds): wall_time = fixed + per prefill token + per decode KV token + per decode
	// request, with a few percent of noise.
	simFixedLatency    = 0.002
	simPrefillTokenLat = 28e-6
	simDecodeKVLat     = 0.04e-6
	simDecodeReqLat    = 30e-6
)

// Engine is a deterministic simulation of one DP rank's vLLM scheduler, producing the ForwardPassMetrics
// Dynamo's InstrumentedScheduler would emit for it. Requests arrive at a Poisson rate that swings slowly
// with load; each step schedules the running requests first (one token per decoding request, a chunk of
// the token budget for a prefilling one), then admits waiting requests while the batch, the token budget
// and the KV cache allow, preempting the newest running request when the KV cache is full.
//
// FPM fields follow Dynamo's extraction: prefill requests are those computing prompt tokens this step
// (sum_prefill_tokens is the chunk, var_prefill_length the population variance of whole prompt lengths,
// sum_prefill_kv_tokens the prefix-cache hits and earlier chunks); decode requests report their KV
// context (growing by one per step); queued_requests describes the waiting queue after the step
// (preempted requests count as queued decode with the KV context they held). wall_time comes from a
// latency model, not a clock.
//
// The same seed and rank give the same sequence of FPMs. An Engine is not safe for concurrent use.
type Engine struct {
	rng         *rand.Rand
	workerID    string
	dpRank      int64
	step        uint64
	running     []*simRequest
	waiting     []*simRequest // FIFO; preempted requests go to the front
	kvUsed      int
	sched       []scheduled // reused per step
	arrivalRate float64     // mean arrivals per step at the middle of the load cycle
}

type simRequest struct {
	prompt    int // prompt length in tokens
	output    int // output tokens to generate
	prefixHit int // prompt tokens found in the prefix cache at first admission
	target    int // tokens to compute before decoding: prompt, or prompt+generated after a preemption
	computed  int // num_computed_tokens
	generated int // output tokens sampled so far
	preempted bool
	kvAtPre   int // KV context held when preempted
	admitted  bool
}

type scheduled struct {
	r        *simRequest
	tokens   int
	kvBefore int
	prefill  bool
}

// NewEngine returns the simulation for one rank. FPMs carry workerID and dpRank; counter_id is left 0
// for the publisher to stamp.
func NewEngine(seed int64, workerID string, dpRank int) *Engine {
	e := &Engine{
		rng:         rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15^uint64(dpRank))),
		workerID:    workerID,
		dpRank:      int64(dpRank),
		arrivalRate: simBaseArrivals,
	}
	for range simInitialRequests {
		e.waiting = append(e.waiting, e.newRequest())
	}
	return e
}

// Step simulates one scheduler iteration. It returns the iteration's FPM, or ok == false for an empty
// batch (nothing scheduled), which Dynamo does not publish.
func (e *Engine) Step() (f schemas.FPM, ok bool) {
	e.step++
	for n := e.arrivals(); n > 0; n-- {
		e.waiting = append(e.waiting, e.newRequest())
	}
	e.schedule()
	if len(e.sched) == 0 {
		return schemas.FPM{}, false
	}

	var prefillLen, decodeKV welford
	s := &f.Scheduled
	prefillTokens := 0
	for _, sc := range e.sched {
		if sc.prefill {
			s.NumPrefillRequests++
			prefillTokens += sc.tokens
			s.SumPrefillKVTokens += int64(sc.kvBefore)
			prefillLen.add(float64(sc.r.prompt))
		} else {
			decodeKV.add(float64(sc.kvBefore))
		}
	}
	s.SumPrefillTokens = int64(prefillTokens)
	s.VarPrefillLength = prefillLen.variance()
	s.NumDecodeRequests = decodeKV.n
	s.SumDecodeKVTokens = int64(decodeKV.sum)
	s.VarDecodeKVTokens = decodeKV.variance()

	lat := simFixedLatency + simPrefillTokenLat*float64(prefillTokens) +
		simDecodeKVLat*decodeKV.sum + simDecodeReqLat*float64(decodeKV.n)
	f.WallTime = lat * math.Max(0.5, 1+0.04*e.rng.NormFloat64())

	e.advance()
	f.Queued = e.queued()
	f.Version = schemas.FPMVersion
	f.WorkerID = e.workerID
	f.DPRank = e.dpRank
	return f, true
}

// arrivals draws this step's number of new requests (Poisson, Knuth's method).
func (e *Engine) arrivals() int {
	lambda := e.arrivalRate * (1 + 0.6*math.Sin(2*math.Pi*float64(e.step)/simLoadPeriod))
	limit, n, p := math.Exp(-lambda), 0, e.rng.Float64()
	for p > limit {
		n++
		p *= e.rng.Float64()
	}
	return n
}

func (e *Engine) newRequest() *simRequest {
	r := &simRequest{
		prompt: clamp(int(math.Exp(5.99+0.9*e.rng.NormFloat64())), 8, 8192), // median ~400
		output: clamp(int(math.Exp(4.79+0.7*e.rng.NormFloat64())), 1, 1024), // median ~120
	}
	if e.rng.Float64() < simPrefixHitProb {
		hit := int(float64(r.prompt)*(0.2+0.7*e.rng.Float64())) / simBlockSize * simBlockSize
		r.prefixHit = min(hit, r.prompt-1) / simBlockSize * simBlockSize
	}
	r.target = r.prompt
	return r
}

// schedule fills e.sched with this step's batch, in vLLM V1's order: running requests, then waiting ones.
func (e *Engine) schedule() {
	e.sched = e.sched[:0]
	budget := simMaxBatchTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		prefill := r.computed < r.target
		n := 1
		if prefill {
			n = min(r.target-r.computed, budget)
		}
		for e.kvUsed+n > simKVCapacity && len(e.running) > i {
			e.preemptLast()
			preempted = true
		}
		if i >= len(e.running) { // r itself was preempted
			break
		}
		e.kvUsed += n
		budget -= n
		e.sched = append(e.sched, scheduled{r: r, tokens: n, kvBefore: r.computed, prefill: prefill})
	}
	for !preempted && len(e.waiting) > 0 && len(e.running) < simMaxRunning && budget > 0 {
		r := e.waiting[0]
		if !r.admitted {
			r.computed = r.prefixHit
		}
		n := min(r.target-r.computed, budget)
		held := 0
		if !r.admitted {
			held = r.computed // prefix-cache blocks become this request's
		}
		if e.kvUsed+held+n > simKVCapacity {
			break
		}
		e.waiting = e.waiting[1:]
		r.admitted, r.preempted = true, false
		e.kvUsed += held + n
		budget -= n
		e.running = append(e.running, r)
		e.sched = append(e.sched, scheduled{r: r, tokens: n, kvBefore: r.computed, prefill: true})
	}
}

// preemptLast moves the newest running request to the front of the waiting queue. Like vLLM's recompute
// preemption it frees the request's KV; it must recompute prompt and output so far when resumed.
func (e *Engine) preemptLast() {
	last := len(e.running) - 1
	r := e.running[last]
	e.running[last] = nil
	e.running = e.running[:last]
	e.kvUsed -= r.computed
	r.preempted, r.kvAtPre = true, r.computed
	r.computed = 0
	r.target = r.prompt + r.generated
	e.waiting = append([]*simRequest{r}, e.waiting...)
}

// advance applies the step's results: computed tokens, sampled tokens, finished requests.
func (e *Engine) advance() {
	for _, sc := range e.sched {
		r := sc.r
		r.computed += sc.tokens
		if !sc.prefill || r.computed == r.target { // a decode step, or the last prefill chunk, samples a token
			r.generated++
		}
	}
	kept := e.running[:0]
	for _, r := range e.running {
		if r.computed >= r.target && r.generated >= r.output {
			e.kvUsed -= r.computed
			continue
		}
		kept = append(kept, r)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// queued summarises the waiting queue as Dynamo's _compute_queued does.
func (e *Engine) queued() schemas.QueuedRequests {
	var prefill, decode welford
	for _, r := range e.waiting {
		if r.preempted {
			decode.add(float64(r.kvAtPre))
		} else {
			prefill.add(float64(r.prompt))
		}
	}
	return schemas.QueuedRequests{
		NumPrefillRequests: prefill.n,
		SumPrefillTokens:   int64(prefill.sum),
		VarPrefillLength:   prefill.variance(),
		NumDecodeRequests:  decode.n,
		SumDecodeKVTokens:  int64(decode.sum),
		VarDecodeKVTokens:  decode.variance(),
	}
}

// welford accumulates count, sum and population variance (Dynamo's WelfordAccumulator).
type welford struct {
	n        int64
	sum      float64
	mean, m2 float64
}

func (w *welford) add(x float64) {
	w.n++
	w.sum += x
	d := x - w.mean
	w.mean += d / float64(w.n)
	w.m2 += d * (x - w.mean)
}

func (w *welford) variance() float64 {
	if w.n < 2 {
		return 0
	}
	return max(0, w.m2/float64(w.n))
}

func clamp(v, lo, hi int) int { return max(lo, min(v, hi)) }

// Heartbeat returns the idle heartbeat Dynamo's publisher sends: version 1, worker_id and dp_rank set,
// counter_id the given sequence, every other field zero (wall_time 0.0).
func Heartbeat(workerID string, dpRank int, seq uint64) schemas.FPM {
	return schemas.FPM{Version: schemas.FPMVersion, WorkerID: workerID, DPRank: int64(dpRank), CounterID: int64(seq)}
}
