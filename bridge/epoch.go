package bridge

import (
	"strconv"
	"sync"

	"github.com/fpmbus/fpmbus/streams"
)

// Epochs tell publisher runs apart.
//
// Dynamo's publisher numbers its messages from 0 with one counter per process, so (key, sequence) alone
// repeats after every worker restart. The bridge therefore tags every publisher run with an epoch
// (header Fpm-Epoch, and part of every FPM's message id, see streams.FPMMsgID: two runs are two runs
// even when their bytes agree).
//
// The reader goroutine notices runs locally, without the broker: a sequence <= the last one seen for
// the key (the publisher restarted), or the bridge's first message of a key since it started, starts a
// new run, tagged at once with a provisional local epoch, this bridge's receive time (Unix ms) of the
// run's first message, strictly increasing per key. The local epoch only orders this bridge's runs (drop
// ranges, a size dead letter's evidence). The epoch that is published is agreed on by every bridge
// subscribed to the publisher (runs.go): the publisher goroutine resolves it before it publishes
// anything of the run, through KV bucket streams.BucketBridgeRuns.
type epochs struct {
	mu   sync.Mutex
	keys map[streams.Key]*epochState
}

// epochState is the state of one publisher key, guarded by epochs.mu.
type epochState struct {
	run  *run   // the current run; nil before the first message
	last uint64 // last sequence seen in this run
}

// run is one publisher run of one key as this bridge saw it. The reader goroutine creates it and then
// only reads its immutable fields; agreed and prev belong to the publisher goroutine (runs.go).
type run struct {
	key      streams.Key
	local    int64  // provisional epoch (Unix ms): strictly increasing per key on this bridge
	firstSeq uint64 // the first sequence of the run this bridge received
	// restarted: the run began with the sequence going back (this bridge saw the publisher restart);
	// otherwise it is the bridge's first run of the key since it started.
	restarted bool
	subject   string // streams.FPMSubject(key)
	rankStr   string // key.DPRank in decimal

	// Publisher goroutine only.
	prev      *run   // the run before, until this one is agreed (its epoch bounds this one's)
	agreed    int64  // the agreed epoch; 0 until resolved
	agreedStr string // agreed in decimal
}

func newRun(k streams.Key, local int64, firstSeq uint64, prev *run) *run {
	return &run{
		key:       k,
		local:     local,
		firstSeq:  firstSeq,
		restarted: prev != nil,
		prev:      prev,
		subject:   streams.FPMSubject(k),
		rankStr:   strconv.Itoa(k.DPRank),
	}
}

func newEpochs() *epochs {
	return &epochs{keys: make(map[streams.Key]*epochState)}
}

// observe records sequence seq of key k received at nowMs and returns the run it belongs to.
// newEpoch is true for the first message of a key and after a restart (seq <= last seen).
func (e *epochs) observe(k streams.Key, seq uint64, nowMs int64) (r *run, newEpoch bool) {
	e.mu.Lock()
	st := e.keys[k]
	if st == nil {
		st = &epochState{}
		e.keys[k] = st
	}
	if st.run == nil || seq <= st.last {
		next := nowMs
		if st.run != nil && next <= st.run.local {
			next = st.run.local + 1
		}
		st.run, newEpoch = newRun(k, next, seq, st.run), true
	}
	st.last = seq
	r = st.run
	e.mu.Unlock()
	return r, newEpoch
}
