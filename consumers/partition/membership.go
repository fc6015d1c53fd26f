package partition

import (
	"cmp"
	"hash/fnv"
	"slices"
	"strconv"
	"time"
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
