package merge

import "hash/fnv"

// Partition returns the partition (0..n-1) that owns run runID: fnv-1a(run_id) mod n. Each merger
// instance owns one partition, so two instances never merge the same run.
func Partition(runID string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(runID))
	return int(h.Sum32() % uint32(n))
}
