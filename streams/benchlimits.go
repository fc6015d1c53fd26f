package streams

import (
	"errors"
	"fmt"
	"strconv"
)

// Limits of benchmark runs: what a run_id and an artefact body may be for every place fpmbus carries
// them. Both are checked where they enter (`fpmbus bench publish` and `bench validate` refuse, naming
// the field or the file) and again by the merger and the sealer, which read what anyone with publish
// rights put on FPM_BENCH: a run or a body that breaks them becomes an outcome or a dead letter there,
// never a retry.

// MaxRunIDToken is the longest run_id, counted as its subject token (EncodeToken: an ASCII letter,
// digit, '-' or '_' is one byte, every other byte three, "%XX"). The token is the run's name in every
// subject (fpmbench.rank.<run>.<rank>, fpmevents.bench.<run>.outcome), object name
// (rank/<run>/<rank>/<sha256>), spool directory and merged file name, and the file name is the tightest
// of them: a name is at most 255 bytes (NAME_MAX), and the merger's default output
// benchmark_results_{run_id}_merged.json ends in the temporary file of its sidecar,
// benchmark_results_<run>_merged_worker_probe.json.tmp-<10 digits>, 58 bytes besides the token. 128
// leaves a --bench-output template 69 bytes of its own in that name (merge checks the template at
// start). Subjects (max_control_line, 4096 bytes by default) and headers allow far more.
const MaxRunIDToken = 128

// ErrRunID: a run_id that cannot name a run everywhere fpmbus carries it (CheckRunID).
var ErrRunID = errors.New("streams: run_id cannot name a run")

// CheckRunID reports why runID cannot name a benchmark run: it is empty, holds a control character
// (it is the unencoded value of the Fpm-Bench-Run header, which must stay one header line), or its
// subject token is longer than MaxRunIDToken. The error wraps ErrRunID and says which limit.
func CheckRunID(runID string) error {
	if runID == "" {
		return fmt.Errorf("%w: run_id is empty", ErrRunID)
	}
	for i := 0; i < len(runID); i++ {
		if c := runID[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: run_id holds control character %q at byte %d", ErrRunID, c, i)
		}
	}
	if n := len(EncodeToken(runID)); n > MaxRunIDToken {
		return fmt.Errorf("%w: run_id is %d bytes (%d as a subject token); the limit is %d token bytes "+
			"(ASCII letters, digits, '-' and '_' count 1, every other byte 3)", ErrRunID, len(runID), n, MaxRunIDToken)
	}
	return nil
}

// DefaultBenchMaxArtefact is the largest benchmark artefact body (rank artefact, worker-probe replies,
// collection profile, merged artefact) fpmbus reads: 256 MiB, above the 170 MB rank artefact of an
// 8-rank run of 2,000 points with raw samples. Checking an artefact holds it and its parse tree in
// memory (about 4x its size for a real rank artefact), so the limit bounds the memory of `bench
// validate`, `bench publish`, `bench merge`, the merger and the sealer; each takes a flag to change it
// (--max-artefact-size of the bench commands, --merge-max-artefact-size of the merger,
// --seal-max-artefact-size of the sealer). A larger artefact is refused from its size alone (the
// file's stat, the message's Fpm-Bench-Size header), before any of it is read.
const DefaultBenchMaxArtefact int64 = 256 << 20

// errArtefactTooLarge: an artefact body is larger than the maximum artefact size.
var errArtefactTooLarge = errors.New("streams: benchmark artefact larger than the maximum artefact size")

// CheckArtefactSize refuses an artefact of size bytes when it is larger than limit (limit <= 0: no
// limit); what names the artefact (a file, a subject and sequence).
func CheckArtefactSize(what string, size, limit int64) error {
	if limit > 0 && size > limit {
		return fmt.Errorf("%w: %s is %d bytes (%s); the limit is %d bytes (%s): refused before reading it",
			errArtefactTooLarge, what, size, mib(size), limit, mib(limit))
	}
	return nil
}

func mib(n int64) string {
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
}
