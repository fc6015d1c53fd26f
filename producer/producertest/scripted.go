package producertest

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/schemas"
)

// Scripted is an FPM publisher driven step by step by a test, on the synthetic publisher's own socket
// (producer.Sender: Dynamo's three frames, non-blocking sends) made an XPUB so that the test can wait
// for the bridge's subscription. It numbers every message it tries to send, heartbeats included, from
// 0, with counter_id = the sequence frame, and records which numbers libzmq refused (or the test
// skipped). Its FPMs carry WorkerID and DPRank: the bridge files each FPM under the payload's worker_id
// and dp_rank (subject fpm.<namespace>.<component>.<worker_id>.<dp_rank>), so DPRank should be the rank
// of the endpoint the bridge reads it from (tcp://host:base+rank); a different one is stored under the
// payload's and logged once by the bridge.
//
// Like Sender it is owned by one goroutine (the test's).
type Scripted struct {
	tb       testing.TB
	s        *producer.Sender
	workerID string
	dpRank   int
	sent     uint64 // next sequence number
	lost     []uint64
	// wallTime is the wall_time of its busy passes: each Scripted has its own (scriptedRuns), as each
	// run of a real worker measures its own passes, so a test can tell two runs' FPMs apart by their
	// bodies (the bridge tells them apart by their run's epoch, whatever the bytes).
	wallTime float64
}

// scriptedRuns numbers the Scripted publishers of the test binary.
var scriptedRuns atomic.Uint64

// NewScripted binds endpoint ("tcp://127.0.0.1:*" picks a free port; see Endpoint) with send high-water
// mark hwm (0: unlimited) and linger 0. nodrop sets ZMQ_XPUB_NODROP: a full pipe then refuses the send
// (EAGAIN, which Dynamo's publisher treats as a drop) instead of libzmq dropping the message silently,
// so Lost is exactly the numbers that never left the process. Its FPMs carry workerID and dpRank. The
// socket is closed by tb's Cleanup.
func NewScripted(tb testing.TB, endpoint string, hwm int, nodrop bool, workerID string, dpRank int) *Scripted {
	tb.Helper()
	if hwm == 0 {
		hwm = -1 // producer.NewSender: negative is unlimited
	}
	s, err := producer.NewSender(nil, endpoint, hwm, producer.WithSubscriberCount(), producer.WithNoDrop(nodrop), producer.WithLinger(0))
	if err != nil {
		tb.Fatal(err)
	}
	p := &Scripted{tb: tb, s: s, workerID: workerID, dpRank: dpRank, wallTime: 0.02 + float64(scriptedRuns.Add(1))*1e-6}
	tb.Cleanup(p.Close)
	return p
}

// Endpoint is the bound endpoint (with the port libzmq chose for a wildcard).
func (p *Scripted) Endpoint() string { return p.s.Endpoint() }

// Close closes the socket and its context; safe to call twice.
func (p *Scripted) Close() { _ = p.s.Close() }

// WaitSubscribed blocks until one subscriber (the bridge) has subscribed, at most 15 s; it fails the
// test otherwise. Call it before the first Send: ZMQ drops what is sent before a subscriber joined.
func (p *Scripted) WaitSubscribed() {
	p.tb.Helper()
	if err := p.s.WaitSubscribers(1, 15*time.Second); err != nil {
		p.tb.Fatal(err)
	}
}

// Send sends the next number without blocking, as Dynamo does: a refused send is lost (recorded in
// Lost) and the number is consumed anyway. It reports whether libzmq accepted the message. A busy
// forward pass unless heartbeat (Dynamo's all-zero idle heartbeat).
func (p *Scripted) Send(heartbeat bool) bool {
	p.tb.Helper()
	seq := p.sent
	p.sent++
	f := &schemas.FPM{Version: 1, WorkerID: p.workerID, DPRank: int64(p.dpRank), CounterID: int64(seq)}
	if !heartbeat {
		f.WallTime = p.wallTime
		f.Scheduled = schemas.ScheduledRequests{NumPrefillRequests: 1, SumPrefillTokens: 128, NumDecodeRequests: 2, SumDecodeKVTokens: 512}
	}
	if err := p.s.Send(seq, schemas.EncodeMsgpack(f)); err != nil {
		if errors.Is(err, producer.ErrDropped) {
			p.lost = append(p.lost, seq)
			return false
		}
		p.tb.Fatalf("send %d: %v", seq, err)
	}
	return true
}

// Skip uses the next number without sending it, as a publisher that lost it before its socket would
// (Dynamo drops a message it cannot enqueue): it is recorded in Lost.
func (p *Scripted) Skip() {
	p.lost = append(p.lost, p.sent)
	p.sent++
}

// SendN sends n busy forward passes, one every `every` (0: as fast as possible).
func (p *Scripted) SendN(n int, every time.Duration) {
	p.tb.Helper()
	for range n {
		p.Send(false)
		if every > 0 {
			time.Sleep(every)
		}
	}
}

// Sent is how many numbers were used: the next one is Sent().
func (p *Scripted) Sent() uint64 { return p.sent }

// Lost returns the numbers that never left the process, in order (a copy): refused by libzmq, or
// skipped (Skip).
func (p *Scripted) Lost() []uint64 { return slices.Clone(p.lost) }

// Runs turns sequence numbers (such as Lost) into their maximal contiguous ranges [first, last], in
// order. seqs is not modified.
func Runs(seqs []uint64) [][2]uint64 {
	seqs = slices.Clone(seqs)
	slices.Sort(seqs)
	var out [][2]uint64
	for _, s := range seqs {
		if n := len(out); n > 0 && out[n-1][1]+1 == s {
			out[n-1][1] = s
		} else {
			out = append(out, [2]uint64{s, s})
		}
	}
	return out
}
