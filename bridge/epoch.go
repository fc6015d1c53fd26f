package bridge

import (
	"strconv"
	"sync"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

// Epochs tell publisher runs apart.
//
// Dynamo's publisher numbers its messages from 0 with one counter per process, so (key, sequence) alone
// repeats after every worker restart. The bridge therefore tags every publisher run with an epoch
// (header Fpm-Epoch, and part of every FPM's message id, see streams.FPMMsgID: two runs are two runs
// even when their bytes agree).
//
// The reader goroutine notices runs locally, without the broker. A message starts a new local run
// when it is
//
//   - the bridge's first message of its key since the bridge started (runStart): the bridge cannot
//     know what the publisher did while no bridge of this process listened;
//   - at or below the last sequence seen of the key (runRestart): the publisher restarted, for certain;
//   - the key's first message on a new connection to its endpoint (or from another endpoint), above
//     the last sequence seen (runReconnect). A PUB subscriber sees a publisher restart only as its connection ending and a
//     new one beginning (the restarted process has a new socket), so a run that goes on forward across
//     a reconnect may be a new run whose first numbers were sent before the bridge reconnected (so
//     many of them that the sequence is past the old run's last), or the old run after a connection
//     that broke without a restart. The bridge cannot tell, and never guesses continuity: the run is
//     new unless another bridge that kept its connection shows it is not (runs.go), and the gap
//     detector names its first numbers missing (cause reconnect). Sessions (socket.go) are exact: the
//     reader drains what the ended connection delivered before it connects again, so no message of
//     an old connection is taken for one of the new.
//   - the key's first message after the reader was stalled on a connection that goes on (runResume:
//     the process was stopped, or starved, see socket.go). The publisher did not restart (its
//     connection survived), but a redundant bridge that started meanwhile saw nothing of this one
//     and may have recorded the run anew: the run re-agrees its epoch, keeping its own unless the other
//     bridge's FPMs show another.
//
// A new local run is tagged at once with a provisional local epoch, this bridge's receive time (Unix
// ms) of the run's first message, strictly increasing per key. The local epoch only orders this
// bridge's runs (drop ranges, a size dead letter's evidence). The epoch that is published is agreed on
// by every bridge subscribed to the publisher (runs.go): the publisher goroutine resolves it before it
// publishes anything of the run, through KV bucket streams.BucketBridgeRuns, showing the run is one
// another bridge recorded by the messages both received (each run keeps the identities of its first
// and most recent messages for that).
type epochs struct {
	mu   sync.Mutex
	keys map[streams.Key]*epochState
	// readersStopped: the bridge is stopping and reads no more; every run is over here at its last
	// message (evidence), as one a later run followed is.
	readersStopped bool
}

// stopReading records that the readers stopped: no run receives another message here.
func (e *epochs) stopReading() {
	e.mu.Lock()
	e.readersStopped = true
	e.mu.Unlock()
}

// epochState is the state of one publisher key, guarded by epochs.mu.
type epochState struct {
	run     *run   // the current run; nil before the first message
	last    uint64 // last sequence seen in this run
	slot    int    // the endpoint the last message came from
	session uint64 // and its connection and session there (Bridge.sessions: connection<<32 | session)
}

// runKind is how a local run began.
type runKind uint8

const (
	runStart     runKind = iota // the bridge's first message of the key since it started
	runResume                   // the first message after the reader was stalled on a connection that goes on
	runReconnect                // the first message of a new connection, the sequence further on
	runRestart                  // the sequence went back
)

// strongest is how the agreed run began, from what two bridges saw of it: a restart over a reconnect
// over neither (a start, or a resume, which say nothing of the publisher).
func strongest(a, b runKind) runKind {
	if a == runResume {
		a = runStart
	}
	if b == runResume {
		b = runStart
	}
	return max(a, b)
}

// String is the kind as streams.RunEntry.Start and header Fpm-Run-Start spell it ("" for runStart).
func (k runKind) String() string {
	switch k {
	case runRestart:
		return streams.RunStartRestart
	case runReconnect:
		return streams.RunStartReconnect
	}
	return ""
}

// describe names k in logs.
func (k runKind) describe() string {
	switch k {
	case runRestart:
		return "restart"
	case runReconnect:
		return "reconnect"
	case runResume:
		return "resume after a stall"
	}
	return "first run since the bridge started"
}

func parseRunKind(s string) runKind {
	switch s {
	case streams.RunStartRestart:
		return runRestart
	case streams.RunStartReconnect:
		return runReconnect
	}
	return runStart
}

// A run keeps the identities of its first runFirst messages and of its most recent runRecent: the
// evidence runs.go matches another bridge's record and stored FPMs against. The recent ones cover
// another bridge's publishing lagging this bridge's reader by up to runRecent messages (1.3 s at 400
// FPMs per second per rank): each is 24 bytes, so a key's current run holds about 14 KiB.
const (
	runFirst  = 64
	runRecent = 512
)

// seen is one received message of a run: its sequence, the first 8 bytes of its payload digest and
// its receive time (Unix ms).
type seen struct {
	seq    uint64
	dig    uint64
	recvMs int64
}

// digestKey is the first 8 bytes of a payload digest (streams.PayloadDigest, hex), enough to tell
// two payloads at one number apart; 0 if digest is not one.
func digestKey(digest string) uint64 {
	if len(digest) < 16 {
		return 0
	}
	v, err := strconv.ParseUint(digest[:16], 16, 64)
	if err != nil {
		return 0
	}
	return v
}

// run is one publisher run of one key as this bridge saw it. The reader goroutine creates it and then
// only reads its immutable fields; first, recent, lastMs and ended are the reader's, read by the
// publisher goroutine under epochs.mu (epochs.evidence); agreed, kind and prev belong to the publisher
// goroutine (runs.go).
type run struct {
	key         streams.Key
	local       int64  // provisional epoch (Unix ms): strictly increasing per key on this bridge
	firstSeq    uint64 // the first sequence of the run this bridge received
	firstDigest string // its payload digest
	kind        runKind
	subject     string // streams.FPMSubject(key)
	rankStr     string // key.DPRank in decimal

	// Reader goroutine, under epochs.mu.
	first  []seen          // the run's first runFirst messages
	recent [runRecent]seen // its most recent ones, a ring
	nRecv  int             // messages received in the run
	lastMs int64           // receive time of its latest message
	ended  bool            // a later run of the key began on this bridge

	// Publisher goroutine only.
	prev      *run      // the run before, until this one is agreed (its epoch bounds this one's)
	heldSince time.Time // when its agreement first failed because the bucket did not answer (runs.go)
	outage    time.Time // when the publishing outage it was first agreed in began, if it was (runs.go)
	agreed    int64     // the agreed epoch; 0 until resolved
	agreedStr string    // agreed in decimal
	start     runKind   // how the agreed run began (header Fpm-Run-Start), once agreed
	startHdr  []string  // Fpm-Run-Start's value for start, nil for runStart (shared by the run's FPMs)
	// A resumed run whose agreed epoch is a run another bridge recorded while this one was stalled,
	// from its first message split on: the run's FPMs below split are the previous run's (its epoch
	// before, header beforeHdr), which that bridge had not joined yet. The same after a stall of this
	// bridge's publishing (runs.go, afterStall): before is then the run's own first epoch.
	split     uint64
	before    int64
	beforeStr string
	beforeHdr []string
	// stalls is the publisher's stall count when this run last looked for a re-recording (afterStall).
	stalls int
}

// epochFor returns the agreed epoch of FPM seq of r (agreed), in decimal, and its Fpm-Run-Start.
// Publisher goroutine.
func (r *run) epochFor(seq uint64) (int64, string, []string) {
	if seq < r.split {
		return r.before, r.beforeStr, r.beforeHdr
	}
	return r.agreed, r.agreedStr, r.startHdr
}

func newRun(k streams.Key, local int64, firstSeq uint64, digest string, kind runKind, prev *run) *run {
	return &run{
		key:         k,
		local:       local,
		firstSeq:    firstSeq,
		firstDigest: digest,
		kind:        kind,
		prev:        prev,
		subject:     streams.FPMSubject(k),
		rankStr:     strconv.Itoa(k.DPRank),
	}
}

// add records message s of r. epochs.mu held.
func (r *run) add(s seen) {
	if len(r.first) < runFirst {
		r.first = append(r.first, s)
	}
	r.recent[r.nRecv%runRecent] = s
	r.nRecv++
	r.lastMs = s.recvMs
}

// received returns when r received the message seq with payload digest, if it is among the messages
// r keeps. epochs.mu held.
func (r *run) received(seq uint64, digest string) (int64, bool) {
	dig := digestKey(digest)
	if dig == 0 {
		return 0, false
	}
	for _, s := range r.first {
		if s.seq == seq && s.dig == dig {
			return s.recvMs, true
		}
	}
	for i := range min(r.nRecv, runRecent) {
		if s := r.recent[i]; s.seq == seq && s.dig == dig {
			return s.recvMs, true
		}
	}
	return 0, false
}

func newEpochs() *epochs {
	return &epochs{keys: make(map[streams.Key]*epochState)}
}

// observe records sequence seq of key k, with payload digest, received at nowMs from endpoint slot on
// session (Bridge.sessions), and returns the run it belongs to; newEpoch is true when it starts a new
// run (see above).
func (e *epochs) observe(k streams.Key, seq uint64, nowMs int64, digest string, slot int, session uint64) (r *run, newEpoch bool) {
	e.mu.Lock()
	st := e.keys[k]
	if st == nil {
		st = &epochState{}
		e.keys[k] = st
	}
	kind, start := runStart, st.run == nil
	switch {
	case start:
	case seq <= st.last:
		kind, start = runRestart, true
	case slot != st.slot || session>>32 != st.session>>32:
		kind, start = runReconnect, true
	case session != st.session:
		kind, start = runResume, true
	}
	if start {
		next := nowMs
		if old := st.run; old != nil {
			old.ended = true
			if next <= old.local {
				next = old.local + 1
			}
		}
		st.run, newEpoch = newRun(k, next, seq, digest, kind, st.run), true
	}
	st.last, st.slot, st.session = seq, slot, session
	st.run.add(seen{seq: seq, dig: digestKey(digest), recvMs: nowMs})
	r = st.run
	e.mu.Unlock()
	return r, newEpoch
}

// runEvidence is what the publisher goroutine reads of a run to resolve it (runs.go).
type runEvidence struct {
	lastMs int64 // receive time of the run's latest message so far
	ended  bool  // a later run began, or the readers stopped: the run is over on this bridge
}

// evidence returns r's receive span so far.
func (e *epochs) evidence(r *run) runEvidence {
	e.mu.Lock()
	defer e.mu.Unlock()
	return runEvidence{lastMs: r.lastMs, ended: r.ended || e.readersStopped}
}

// ownPace is how fast r's numbers went as this bridge received them, from its first message (the
// anchor) to its latest (runs.go, pace.reachedBack); zero while they span too little to measure it
// (minPaceNumbers, minPaceSpan).
func (e *epochs) ownPace(r *run) pace {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.nRecv == 0 || len(r.first) == 0 {
		return pace{}
	}
	f, l := r.first[0], r.recent[(r.nRecv-1)%runRecent]
	if l.seq <= f.seq || l.seq-f.seq < minPaceNumbers || l.recvMs-f.recvMs < minOwnPaceSpan.Milliseconds() {
		return pace{}
	}
	return pace{seq: f.seq, atMs: f.recvMs, perMs: float64(l.seq-f.seq) / float64(l.recvMs-f.recvMs)}
}

// received reports when r received message seq with payload digest, if it keeps it.
func (e *epochs) received(r *run, seq uint64, digest string) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return r.received(seq, digest)
}
