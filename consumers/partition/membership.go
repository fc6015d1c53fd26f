package partition

import (
	"cmp"
	"context"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/retrywait"
)

// view is a member's picture of the group's live members, fed by the members bucket's watcher. A
// member is live while its heartbeat (re-put every PinnedTTL/4) is younger than ttl; a graceful leave
// deletes its key at once.
type view struct {
	ttl  time.Duration
	seen map[string]time.Time
}

func newView(ttl time.Duration) *view { return &view{ttl: ttl, seen: map[string]time.Time{}} }

func (v *view) put(id string, at time.Time) bool {
	_, had := v.seen[id]
	if at.After(v.seen[id]) {
		v.seen[id] = at
	}
	return !had
}

func (v *view) del(id string) bool {
	_, had := v.seen[id]
	delete(v.seen, id)
	return had
}

// live returns the members whose heartbeat is younger than ttl, sorted, forgetting the others.
func (v *view) live(now time.Time) []string {
	out := make([]string, 0, len(v.seen))
	for id, at := range v.seen {
		if now.Sub(at) < v.ttl {
			out = append(out, id)
		} else {
			delete(v.seen, id)
		}
	}
	slices.Sort(out)
	return out
}

// liveWith is live plus self: a member knows it is alive whether or not its heartbeats reach the
// bucket (or come back through the watch), so it never assigns itself nothing while it runs.
func (v *view) liveWith(self string, now time.Time) []string {
	out := v.live(now)
	if i, found := slices.BinarySearch(out, self); !found {
		out = slices.Insert(out, i, self)
	}
	return out
}

// assign maps each partition to one member: balanced (no member gets more than ceil(P/N)) and
// stable (rendezvous hashing: each partition goes to the highest-scoring member with room left, so a
// member joining or leaving moves few partitions). Every member computes it from the same live set.
func assign(members []string, partitions int) map[string][]int {
	out := make(map[string][]int, len(members))
	if len(members) == 0 {
		return out
	}
	capacity := (partitions + len(members) - 1) / len(members)
	type cand struct {
		id    string
		score uint64
	}
	cands := make([]cand, len(members))
	for p := range partitions {
		for i, id := range members {
			h := fnv.New64a()
			_, _ = h.Write([]byte(id))
			_, _ = h.Write([]byte{0})
			_, _ = h.Write([]byte(strconv.Itoa(p)))
			cands[i] = cand{id, h.Sum64()}
		}
		slices.SortFunc(cands, func(a, b cand) int {
			if c := cmp.Compare(b.score, a.score); c != 0 {
				return c
			}
			return cmp.Compare(a.id, b.id)
		})
		for _, c := range cands {
			if len(out[c.id]) < capacity {
				out[c.id] = append(out[c.id], p)
				break
			}
		}
	}
	return out
}

// membersWatch follows the group's keys in the members bucket for a member's view, and keeps doing so
// across outages of the bucket's stream: a watch that ends (nats.go gives up re-creating the watch's
// consumer when the stream does not answer) is opened again with backoff, and a watch that stays open
// but no longer delivers (the member's own puts, acknowledged by the stream, do not come back through
// it within stall) is replaced. Meanwhile the view keeps what it had; the member counts itself live
// (view.liveWith), so it never gives up its partitions because the bucket is away.
//
// All of it runs on the member's Consume goroutine.
type membersWatch struct {
	kv     jetstream.KeyValue
	filter string
	self   string // the member's id; its key is <prefix><self>
	prefix string
	stall  time.Duration
	log    *slog.Logger

	w       jetstream.KeyWatcher // nil while none is open
	initial bool                 // w is still sending the current values (before its nil marker)
	// failedAt is when opening began to fail (zero: the last attempt succeeded); retryAt when to try
	// again, waits the backoff.
	failedAt time.Time
	retryAt  time.Time
	waits    backoff.BackOff
	// seenRev is the newest revision of the member's own key delivered by the watch; unseenSince is
	// when a newer put was first noticed undelivered (zero: none).
	seenRev     uint64
	unseenSince time.Time
}

func newMembersWatch(kv jetstream.KeyValue, prefix, self string, stall time.Duration, log *slog.Logger) *membersWatch {
	return &membersWatch{kv: kv, filter: prefix + "*", prefix: prefix, self: self, stall: stall, log: log,
		waits: retrywait.Doubling(minRetryWait, maxRetryWait)}
}

// open starts a watch of the group's keys; on failure the next attempt is due after a backoff.
func (mw *membersWatch) open(ctx context.Context) error {
	w, err := mw.kv.Watch(ctx, mw.filter)
	if err != nil {
		now := time.Now()
		if mw.failedAt.IsZero() {
			mw.failedAt = now
		}
		wait := mw.waits.NextBackOff()
		mw.retryAt = now.Add(wait)
		mw.log.Warn("partition: members watch not opened; retrying", "err", err, "retry_in", wait)
		return err
	}
	mw.w, mw.initial, mw.unseenSince = w, true, time.Time{}
	mw.failedAt = time.Time{}
	mw.waits.Reset()
	return nil
}

// updates is the open watch's channel; nil (never ready) while none is open.
func (mw *membersWatch) updates() <-chan jetstream.KeyValueEntry {
	if mw.w == nil {
		return nil
	}
	return mw.w.Updates()
}

// initialDone: the open watch has sent every current value.
func (mw *membersWatch) initialDone() { mw.initial = false }

// saw records a put of member id at revision rev delivered by the watch.
func (mw *membersWatch) saw(id string, rev uint64) {
	if id == mw.self {
		mw.seenRev = max(mw.seenRev, rev)
	}
}

// ended: the open watch's channel was closed under it; a new one is opened at the next maintain.
func (mw *membersWatch) ended() {
	mw.log.Warn("partition: members watch ended; opening it again")
	mw.w = nil
	mw.retryAt = time.Time{}
}

// failing reports whether the watch has not opened since it first failed, for longer than stall.
func (mw *membersWatch) failing() bool {
	return mw.w == nil && !mw.failedAt.IsZero() && time.Since(mw.failedAt) >= mw.stall
}

// maintain opens a watch when none is open and its retry is due, and replaces the open one when the
// member's own put at revision putRev has not come through it within stall.
func (mw *membersWatch) maintain(ctx context.Context, putRev uint64) {
	now := time.Now()
	if mw.w != nil {
		if putRev <= mw.seenRev {
			mw.unseenSince = time.Time{}
			return
		}
		if mw.unseenSince.IsZero() {
			mw.unseenSince = now
			return
		}
		if now.Sub(mw.unseenSince) < mw.stall {
			return
		}
		mw.log.Warn("partition: members watch stalled (this member's heartbeat did not come back through it); opening a new one",
			"heartbeat_revision", putRev, "seen_revision", mw.seenRev)
		mw.stop()
	}
	if now.Before(mw.retryAt) {
		return
	}
	_ = mw.open(ctx)
}

// stop ends the open watch, if any. Its subscription may be blocked handing over an update (nats.go
// blocks on a full channel, holding the lock its close needs): the channel is drained until closed.
func (mw *membersWatch) stop() {
	if mw.w == nil {
		return
	}
	ch := mw.w.Updates()
	go func() {
		for range ch {
		}
	}()
	_ = mw.w.Stop()
	mw.w = nil
}
