package replay

import (
	"context"
	"time"

	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/schemas"
)

// The pacer: one goroutine walks the plan's steps in order and hands each to the target at its due
// time, start + pass*Period + Due, on the monotonic clock.
//
//   - Never early, never reordered: it waits for each due time, then sends.
//   - A late send goes at once; the schedule is not shifted, so a replay that fell behind (a slow host,
//     a subscriber holding it back) sends what is due back to back until it is on time again, and every
//     lateness is measured against the original schedule and reported. Nothing is dropped to catch up.
//   - Waiting is a runtime timer down to fineWindow before the due time, then nanosleep (sleep_linux.go)
//     for the rest: the runtime's timers wake up to a millisecond late, nanosleep about 0.1 ms.
//   - Each socket has its own sequence, from 0, shared by records and heartbeats as Dynamo's publisher
//     shares it; with CounterRenumber counter_id is that sequence.
//   - Heartbeats (on the sockets the plan marks): after HeartbeatInterval without a successful send on
//     a socket, an all-zero FPM with its worker_id and dp_rank, counter_id its sequence number — what
//     Dynamo's idle publisher sends. They are sent between steps, never delaying one that is due.

// fineWindow is how close to a due time the pacer switches from the runtime's timer to nanosleep.
const fineWindow = 2 * time.Millisecond

// target is where the pacer's messages go. open, send, heartbeat and close are called on the pacer's
// goroutine, in that order; send and heartbeat report the outcome to the reporter (at once, or when
// it is known) and return whether the message was taken.
type target interface {
	open(ctx context.Context, p *Plan) error
	send(ctx context.Context, ev *event, payload []byte) bool
	heartbeat(ctx context.Context, s int, seq uint64, payload []byte) bool
	close() error
	// describe names where socket s's messages go, for the report.
	describe(s int) string
}

// pacer holds the state of one run.
type pacer struct {
	plan   *Plan
	target target
	start  time.Time
	seq    []uint64
	// last is each socket's last successful send (or attempt, for a failed heartbeat), as an offset
	// from start: its heartbeat clock. nextHB is a lower bound of the earliest heartbeat due (last only
	// moves forward).
	last   []time.Duration
	hb     []int // sockets with heartbeats
	nextHB time.Duration
	timer  *time.Timer
	buf    []byte
	ev     event // reused: a target copies what it keeps
}

// run paces the plan from start and returns the passes completed, and ctx's error if it ended first.
func (pc *pacer) run(ctx context.Context) (int, error) {
	p := pc.plan
	pc.seq = make([]uint64, len(p.Sockets))
	pc.last = make([]time.Duration, len(p.Sockets))
	for i := range p.Sockets {
		if p.Sockets[i].Heartbeats && p.Sockets[i].Active() {
			pc.hb = append(pc.hb, i)
		}
	}
	pc.nextHB = p.Config.HeartbeatInterval
	pc.timer = time.NewTimer(time.Hour)
	pc.timer.Stop()
	defer pc.timer.Stop()
	renumber := p.Renumber()
	passes := 0
	var base time.Duration // the pass's start; NewPlan checked that every finite pass fits
	for pass := 0; p.Config.Loops < 0 || pass < p.Config.Loops; pass++ {
		if pass > 0 {
			next, ok := addSpan(base, p.Period)
			if !ok || len(p.Steps) > 0 && p.Steps[len(p.Steps)-1].Due > maxSpan-next {
				return passes, nil // a pass beyond the longest span (a loop run for 292 years) never starts
			}
			base = next
		}
		for i := range p.Steps {
			st := &p.Steps[i]
			due := base + st.Due
			sent, err := pc.waitUntil(ctx, due)
			if err != nil {
				return passes, err
			}
			if i&255 == 0 && ctx.Err() != nil { // a replay running behind never sleeps
				return passes, ctx.Err()
			}
			s := int(st.Socket)
			seq := pc.seq[s]
			pc.seq[s]++
			msg := st.payload.bytes // sent as it is unless counter ids are renumbered
			if renumber {
				pc.buf = st.payload.build(pc.buf[:0], renumber, seq)
				msg = pc.buf
			}
			counter := st.counter
			if renumber {
				counter = int64(seq)
			}
			pc.ev = event{socket: st.Socket, pass: int32(pass), step: int32(i), seq: seq, counter: counter, due: due, sent: sent}
			if pc.target.send(ctx, &pc.ev, msg) {
				pc.last[s] = sent
			}
		}
		passes++
	}
	return passes, nil
}

// waitUntil returns at offset due from the start (with the offset it returned at: the send time),
// sending the heartbeats that fall due meanwhile; or ctx's error. Offsets are read from the monotonic
// clock alone (time.Since of a time with a monotonic reading).
func (pc *pacer) waitUntil(ctx context.Context, due time.Duration) (time.Duration, error) {
	for {
		now := time.Since(pc.start)
		if now >= due {
			return now, nil
		}
		if len(pc.hb) > 0 && now >= pc.nextHB {
			pc.heartbeats(ctx, now)
			continue
		}
		wake := due
		if len(pc.hb) > 0 && pc.nextHB < wake {
			wake = pc.nextHB
		}
		d := wake - now
		if d <= fineWindow {
			fineSleep(d)
			continue
		}
		pc.timer.Reset(d - fineWindow)
		select {
		case <-ctx.Done():
			pc.timer.Stop()
			return now, ctx.Err()
		case <-pc.timer.C:
		}
	}
}

// heartbeats sends a heartbeat on every socket idle for HeartbeatInterval at now, and moves nextHB to
// the earliest one due next.
func (pc *pacer) heartbeats(ctx context.Context, now time.Duration) {
	iv := pc.plan.Config.HeartbeatInterval
	next := now + iv
	for _, s := range pc.hb {
		if due := pc.last[s] + iv; now >= due {
			so := &pc.plan.Sockets[s]
			seq := pc.seq[s]
			pc.seq[s]++
			h := producer.Heartbeat(so.WorkerID, int(so.DPRank), seq)
			pc.buf = schemas.AppendMsgpack(pc.buf[:0], &h)
			pc.target.heartbeat(ctx, s, seq, pc.buf)
			pc.last[s] = now // a failed heartbeat is tried again an interval later, as Dynamo's timer does
		} else if due < next {
			next = due
		}
	}
	pc.nextHB = next
}
