package gaps

import (
	"fmt"

	"github.com/fpmbus/fpmbus/streams"
)

// Partition decides which publishers a detector owns. The detector processes the FPMs and drop markers
// of the publishers it owns, in stream order, and acks the others untouched. Ownership may change
// while the detector runs: a key it gains is loaded from the state bucket and caught up from the
// streams; a key it loses is forgotten (its state is in the bucket for the next owner).
type Partition interface {
	Owns(k streams.Key) bool
}

// All owns every publisher (one detector instance).
type All struct{}

// Owns reports true.
func (All) Owns(streams.Key) bool { return true }

// Static is instance Index of Count: it owns the publishers whose key hashes (FNV-1a of namespace,
// component, worker_id and dp_rank, then mixed) to Index modulo Count. Every instance runs its own durable consumers, so together they see
// every message once per instance and process each publisher in exactly one.
type Static struct {
	Index, Count int
}

// NewStatic checks index and count.
func NewStatic(index, count int) (Static, error) {
	if count < 1 || index < 0 || index >= count {
		return Static{}, fmt.Errorf("%w: partition %d of %d: want 0 <= index < count", ErrInvalidConfig, index, count)
	}
	return Static{Index: index, Count: count}, nil
}

// Owns reports whether k hashes to s.Index.
func (s Static) Owns(k streams.Key) bool {
	if s.Count <= 1 {
		return true
	}
	return PartitionOf(k, s.Count) == s.Index
}

// PartitionOf returns k's partition among count.
func PartitionOf(k streams.Key, count int) int {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for _, s := range [...]string{k.Namespace, k.Component, k.WorkerID} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint32(s[i])) * prime
		}
		h = (h ^ 0) * prime // separator
	}
	for r := uint32(k.DPRank); ; r /= 10 {
		h = (h ^ ('0' + r%10)) * prime
		if r < 10 {
			break
		}
	}
	// FNV-1a's low bits are weak (the parity of the input bytes): mix before taking the remainder.
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return int(h % uint32(count))
}
