package bridge

import (
	"slices"

	"github.com/fpmbus/fpmbus/streams"
)

// What the bridge counted as stored, per publisher key: the ack records behind the lost_after_ack
// check (lostcheck.go). They are written to streams.BucketBridgeAcks every ackCheckpointInterval
// (checkpoint.go) and compared with the FPM stream when the bridge starts and after every reconnect.
//
// A record keeps the publisher's last maxRecordRuns runs (epochs). A run remembers the first and last
// FPM sequence and stream sequence acknowledged, how many were acknowledged, and the sequence ranges
// inside [FirstSeq, LastSeq] it never saw acknowledged (holes: numbers ZMQ lost, drops, dead letters),
// so that a lost tail is reported with its exact numbers and count. Holes are bounded (maxRunHoles);
// past that the oldest are forgotten and HolesFrom says from where the count is exact.

const (
	// maxRecordRuns bounds the runs a record keeps: a publisher restarting in a loop cannot grow it.
	maxRecordRuns = 8
	// maxRunHoles bounds the holes a run keeps.
	maxRunHoles = 64
)

// ackRecord is one publisher key's record, the JSON value of streams.BridgeAckKey(Key).
type ackRecord struct {
	Key streams.Key `json:"key"`
	// Bridge is the bridge that wrote the record; UpdatedAtMs when (its clock).
	Bridge      string   `json:"bridge"`
	UpdatedAtMs int64    `json:"updated_at_ms"`
	Runs        []ackRun `json:"runs"` // oldest first
}

// ackRun is what one publisher run (bridge epoch) had acknowledged.
type ackRun struct {
	Epoch          int64  `json:"epoch"`
	FirstSeq       uint64 `json:"first_seq"`
	LastSeq        uint64 `json:"last_seq"`
	FirstStreamSeq uint64 `json:"first_stream_seq"`
	LastStreamSeq  uint64 `json:"last_stream_seq"`
	Acked          uint64 `json:"acked"`
	// Holes are the sequence ranges inside [FirstSeq, LastSeq] not acknowledged, ascending, disjoint.
	Holes [][2]uint64 `json:"holes,omitempty"`
	// HolesFrom: holes below it were forgotten (more than maxRunHoles); 0 when none were.
	HolesFrom uint64 `json:"holes_from,omitempty"`
}

// ledger holds the records of the keys this bridge acknowledged FPMs of since it started. It belongs to
// the publisher goroutine (acked, snapshot, the reconnect check); no lock.
type ledger struct {
	recs  map[streams.Key]*ackRecord
	dirty map[streams.Key]bool
}

func newLedger() *ledger {
	return &ledger{recs: map[streams.Key]*ackRecord{}, dirty: map[streams.Key]bool{}}
}

// acked records that FPM seq of run epoch of key k was acknowledged at stream sequence streamSeq.
func (l *ledger) acked(k streams.Key, epoch int64, seq, streamSeq uint64) {
	rec := l.recs[k]
	if rec == nil {
		rec = &ackRecord{Key: k}
		l.recs[k] = rec
	}
	i := len(rec.Runs) - 1
	for i >= 0 && rec.Runs[i].Epoch > epoch {
		i--
	}
	if i < 0 || rec.Runs[i].Epoch != epoch {
		if i < len(rec.Runs)-1 {
			return // a late ack of a run older than the newest one the record has, not in it: too old to matter
		}
		rec.Runs = append(rec.Runs, ackRun{Epoch: epoch, FirstSeq: seq, LastSeq: seq, FirstStreamSeq: streamSeq,
			LastStreamSeq: streamSeq, Acked: 1})
		if n := len(rec.Runs); n > maxRecordRuns {
			rec.Runs = slices.Delete(rec.Runs, 0, n-maxRecordRuns)
		}
		l.dirty[k] = true
		return
	}
	if rec.Runs[i].add(seq, streamSeq) {
		l.dirty[k] = true
	}
}

// add counts seq as acknowledged at streamSeq; false when it was already (a duplicate ack).
func (r *ackRun) add(seq, streamSeq uint64) bool {
	switch {
	case seq > r.LastSeq:
		if seq > r.LastSeq+1 {
			r.addHole(r.LastSeq+1, seq-1)
		}
		r.LastSeq = seq
	case seq < r.FirstSeq:
		if seq+1 < r.FirstSeq {
			r.Holes = slices.Insert(r.Holes, 0, [2]uint64{seq + 1, r.FirstSeq - 1})
			r.trimHoles()
		}
		r.FirstSeq = seq
	default:
		if !r.fill(seq) {
			return false
		}
	}
	r.Acked++
	r.FirstStreamSeq = min(r.FirstStreamSeq, streamSeq)
	r.LastStreamSeq = max(r.LastStreamSeq, streamSeq)
	return true
}

// addHole appends the range first..last (above every hole so far).
func (r *ackRun) addHole(first, last uint64) {
	r.Holes = append(r.Holes, [2]uint64{first, last})
	r.trimHoles()
}

func (r *ackRun) trimHoles() {
	if n := len(r.Holes); n > maxRunHoles {
		r.HolesFrom = r.Holes[n-maxRunHoles-1][1] + 1
		r.Holes = slices.Delete(r.Holes, 0, n-maxRunHoles)
	}
}

// fill removes seq from the holes (an ack that came after later ones: a retry); false when seq was in
// none, that is, acknowledged already.
func (r *ackRun) fill(seq uint64) bool {
	for i, h := range r.Holes {
		if seq < h[0] || seq > h[1] {
			continue
		}
		switch {
		case h[0] == h[1]:
			r.Holes = slices.Delete(r.Holes, i, i+1)
		case seq == h[0]:
			r.Holes[i][0]++
		case seq == h[1]:
			r.Holes[i][1]--
		default:
			r.Holes = slices.Insert(r.Holes, i+1, [2]uint64{seq + 1, h[1]})
			r.Holes[i][1] = seq - 1
			r.trimHoles()
		}
		return true
	}
	return false
}

// acknowledgedIn returns the acknowledged numbers of the run within [from, r.LastSeq] as ranges, their
// count, and whether the count is exact (no forgotten hole lies in the range).
func (r *ackRun) acknowledgedIn(from uint64) (ranges [][2]uint64, n uint64, exact bool) {
	from = max(from, r.FirstSeq)
	if from > r.LastSeq {
		return nil, 0, true
	}
	exact = r.HolesFrom == 0 || from >= r.HolesFrom
	cur := from
	for _, h := range r.Holes {
		if h[1] < cur {
			continue
		}
		if h[0] > cur {
			ranges = append(ranges, [2]uint64{cur, h[0] - 1})
			n += h[0] - cur
		}
		cur = h[1] + 1
		if cur > r.LastSeq {
			break
		}
	}
	if cur <= r.LastSeq {
		ranges = append(ranges, [2]uint64{cur, r.LastSeq})
		n += r.LastSeq - cur + 1
	}
	return ranges, n, exact
}

// snapshot returns copies of the records changed since the last snapshot and marks them clean.
func (l *ledger) snapshot(bridge string, nowMs int64) []ackRecord {
	if len(l.dirty) == 0 {
		return nil
	}
	out := make([]ackRecord, 0, len(l.dirty))
	for k := range l.dirty {
		rec := l.recs[k]
		rec.Bridge, rec.UpdatedAtMs = bridge, nowMs
		c := *rec
		c.Runs = make([]ackRun, len(rec.Runs))
		for i, r := range rec.Runs {
			r.Holes = slices.Clone(r.Holes)
			c.Runs[i] = r
		}
		out = append(out, c)
	}
	clear(l.dirty)
	return out
}
