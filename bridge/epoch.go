package bridge

import (
	"strconv"
	"strings"
	"sync"

	"github.com/fpmbus/fpmbus/streams"
)

// Epochs make message ids unique across publisher restarts.
//
// Dynamo's publisher numbers its messages from 0 with one counter per process, so (key, sequence) alone
// repeats after every worker restart, and a restart inside JetStream's duplicate window would make the
// server discard the new run's messages as duplicates. The bridge therefore tags every publisher run
// with an epoch: the bridge's receive time (Unix ms) of the first message of that run, strictly
// increasing per key. Nats-Msg-Id is streams.MsgID(key, epoch, seq):
//
//   - A sequence <= the last one seen for the key starts a new epoch (the publisher restarted), so the
//     new run's ids never collide with the old run's.
//   - The bridge's own retries of one message reuse the message (and its id), so JetStream
//     deduplicates a retry whose first attempt was stored but not acknowledged.
//   - A restarted bridge cannot duplicate stored messages: ZMQ PUB/SUB never replays old messages, so
//     the new bridge only receives messages sent after it connected, and it starts a new epoch for
//     every key it sees (its first message of a key is "the first of a run"), so its ids differ from
//     every id the previous bridge stored even when the sequences overlap.
//
// The epoch is not the publisher's start time; it is when this bridge first saw the run.
type epochs struct {
	mu   sync.Mutex
	keys map[streams.Key]*epochState
}

// epochState is the state of one publisher key, guarded by epochs.mu.
type epochState struct {
	run  *run   // the current run; nil before the first message
	last uint64 // last sequence seen in this run
}

// run is one publisher run of one key as the bridge saw it. It is immutable once created, so readers
// use it without the lock; it also caches the strings every message of the run repeats.
type run struct {
	epoch    int64  // Unix ms; strictly increasing per key
	epochStr string // epoch in decimal
	subject  string // streams.FPMSubject(key)
	rankStr  string // key.DPRank in decimal
	idPrefix string // streams.MsgID(key, epoch, seq) == idPrefix + decimal seq; "" if that does not hold
}

func newRun(k streams.Key, epoch int64) *run {
	r := &run{
		epoch:    epoch,
		epochStr: strconv.FormatInt(epoch, 10),
		subject:  streams.FPMSubject(k),
		rankStr:  strconv.Itoa(k.DPRank),
	}
	// The id format belongs to streams; use the prefix shortcut only while it provably holds.
	if id := streams.MsgID(k, epoch, 0); strings.HasSuffix(id, ":0") {
		p := id[:len(id)-1]
		if streams.MsgID(k, epoch, 18446744073709551615) == p+"18446744073709551615" {
			r.idPrefix = p
		}
	}
	return r
}

// msgID returns streams.MsgID(key, r.epoch, seq) and seq in decimal, with one allocation.
func (r *run) msgID(k streams.Key, seq uint64) (id, seqStr string) {
	if r.idPrefix == "" {
		id = streams.MsgID(k, r.epoch, seq)
		return id, strconv.FormatUint(seq, 10)
	}
	var buf [96]byte
	b := append(buf[:0], r.idPrefix...)
	b = strconv.AppendUint(b, seq, 10)
	id = string(b)
	return id, id[len(r.idPrefix):]
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
		if st.run != nil && next <= st.run.epoch {
			next = st.run.epoch + 1
		}
		st.run, newEpoch = newRun(k, next), true
	}
	st.last = seq
	r = st.run
	e.mu.Unlock()
	return r, newEpoch
}
