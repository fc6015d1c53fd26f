package merge

import (
	"fmt"

	"github.com/fpmbus/fpmbus/streams"
)

// What `fpmbus bench publish` checks before it publishes (benchstore.BenchStore.PublishBench): each rank
// artefact on its own (validateRank) and the run of each worker-probe replies file (ProbeRun). The wire
// side (subjects, headers, ids, the object store) is streams'.

// RankSummary describes a rank artefact that passed validateRank.
type RankSummary struct {
	RunID  string
	Rank   int
	DPSize int
	Points int
}

// validateRank applies every rule that one rank artefact can be checked against on its own: the document
// and status/coverage rules, and every point rule over its synchronised groups (which carry every rank's
// FPMs). Rules that compare ranks are left to the merge. maxSize is the maximum artefact size
// (Options.MaxArtefactSize: 0 the default, negative none).
func validateRank(rf RankFile, maxSize int64) (RankSummary, error) {
	info, err := loadRankInfo(&rf, maxArtefactSize(maxSize))
	if err != nil {
		return RankSummary{}, err
	}
	rf.Rank = info.rank
	res, err := Merge([]RankFile{rf}, nil, Options{MaxArtefactSize: maxSize})
	if err != nil {
		return RankSummary{}, err
	}
	return RankSummary{RunID: res.RunID, Rank: info.rank, DPSize: info.size, Points: res.Points}, nil
}

// ProbeRun checks worker-probe replies read from file and returns their run: runID when given (the
// replies must then name no run or the same one), else the run_id the replies name.
func ProbeRun(runID, file string, data []byte) (string, error) {
	pr, err := parseProbeReplies(data, file)
	if err != nil {
		return "", err
	}
	switch {
	case runID == "" && pr.RunID == "":
		return "", fmt.Errorf("merge: probe replies %s name no run_id; give the run explicitly", file)
	case runID == "":
		runID = pr.RunID
	case pr.RunID != "" && pr.RunID != runID:
		return "", fmt.Errorf("merge: probe replies %s are for run %q, not %q", file, pr.RunID, runID)
	}
	if err := streams.CheckRunID(runID); err != nil {
		return "", fmt.Errorf("merge: probe replies %s: field run_id: %w", file, err)
	}
	return runID, nil
}
