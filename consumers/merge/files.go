package merge

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fpmbus/fpmbus/internal/benchstore"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// The rank artefacts as files on a disk, as `fpmbus bench merge`, `bench validate` and `bench publish`
// read them: never a file that is not a regular one nor one larger than the maximum artefact size, and
// never more than that many bytes of one that grows while it is read.

// ReadRank reads the rank artefact file f, refusing it before reading when it is larger than maxSize,
// and checks it as the merger will (ValidateRank, the artefact recorded under path); a failed
// check names f.
func ReadRank(f, path string, maxSize int64) ([]byte, RankSummary, error) {
	data, err := ReadArtefact(f, maxSize)
	if err != nil {
		return nil, RankSummary{}, err
	}
	sum, err := validateRank(RankFile{Rank: rankFromPath(f), Path: path, Data: data}, maxSize)
	if err != nil {
		return nil, RankSummary{}, RankError(f, err)
	}
	return data, sum, nil
}

// RankError names file f (when given) in a rank artefact's rejection. A run_id over the limits, or an
// artefact over the maximum size, is an invalid.FlagError (the documented limits of input, like a
// flag's: the command exits 2): nothing was published.
func RankError(f string, err error) error {
	if f != "" {
		err = fmt.Errorf("%s: %w", f, err)
	}
	var rej *RejectError
	if errors.As(err, &rej) && (rej.Rule == RuleRunID || rej.Rule == RuleArtefactSize) {
		return invalid.Flagf("%w", err)
	}
	return err
}

// statArtefact returns the size of artefact file f, refusing it unread (an invalid.FlagError) when it is not a
// regular file or is larger than maxSize.
func statArtefact(f string, maxSize int64) (int64, error) {
	st, err := os.Stat(f)
	if err != nil {
		return 0, err
	}
	if !st.Mode().IsRegular() {
		return 0, invalid.Flagf("%s is not a regular file (%s)", f, st.Mode().Type())
	}
	if err := streams.CheckArtefactSize(f, st.Size(), maxSize); err != nil {
		return 0, invalid.Flagf("%w (--max-artefact-size)", err)
	}
	return st.Size(), nil
}

// ReadArtefact reads artefact file f after StatArtefact, never more than maxSize bytes (a file that
// grows meanwhile is refused too).
func ReadArtefact(f string, maxSize int64) ([]byte, error) {
	if _, err := statArtefact(f, maxSize); err != nil {
		return nil, err
	}
	fh, err := os.Open(f)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxSize+1))
	if err != nil {
		return nil, err
	}
	if err := streams.CheckArtefactSize(f, int64(len(data)), maxSize); err != nil {
		return nil, invalid.Flagf("%w (it grew while being read; --max-artefact-size)", err)
	}
	return data, nil
}

// RankFiles are the rank artefact files of one run, to merge offline (`fpmbus bench merge`).
type RankFiles struct {
	Ranks []RankFile // each loaded when the merge reads it
	files []string   // as given, for messages
	// Dynamo names the merged artefact after the configured output path (rank 0's file) and the first
	// rank merged: a node-local merge of ranks 4..7 writes <stem>_dp4_merged<ext>.
	base    string
	dpStart int
}

// OpenRankFiles checks the rank artefact files (StatArtefact) and returns them, each read when the
// merge loads it; read reports the bytes read so far of the total, each file counted once however
// often it is loaded.
func OpenRankFiles(files []string, maxSize int64, read func(read, total uint64)) (RankFiles, error) {
	ranks := make([]RankFile, len(files))
	var (
		readMu    sync.Mutex
		readBytes uint64
		totalSize uint64
		loaded    = make([]bool, len(files))
	)
	base, dpStart := "", -1
	for i, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return RankFiles{}, err
		}
		size, err := statArtefact(f, maxSize)
		if err != nil {
			return RankFiles{}, err
		}
		path, i := f, i
		totalSize += uint64(size)
		ranks[i] = RankFile{Rank: rankFromPath(f), Path: abs, Size: size, Load: func() ([]byte, error) {
			data, err := os.ReadFile(path)
			readMu.Lock()
			if err == nil && !loaded[i] {
				loaded[i], readBytes = true, readBytes+uint64(len(data))
				read(readBytes, totalSize)
			}
			readMu.Unlock()
			return data, err
		}}
		if r := max(rankFromPath(f), 0); dpStart < 0 || r < dpStart {
			base, dpStart = basePathOf(abs), r
		}
	}
	return RankFiles{Ranks: ranks, files: files, base: base, dpStart: dpStart}, nil
}

// MergedPath is where the merged artefact goes, absolute: output (with RunIDPlaceholder replaced by the
// run id of the first rank's header) or, when empty, Dynamo's name for it (MergedPathFor).
func (r RankFiles) MergedPath(output string, maxSize int64) (string, error) {
	out := output
	if out == "" {
		out = mergedPathFor(r.base, r.dpStart)
	}
	if strings.Contains(out, RunIDPlaceholder) { // needed before the merge: the first rank's header has it
		sum, err := validateRank(r.Ranks[0], maxSize)
		if err != nil {
			return "", RankError(r.files[0], err)
		}
		out = expandPath(out, sum.RunID)
	}
	return filepath.Abs(out)
}

// ReadProbeReplies reads and parses worker-probe reply files (ParseProbeReplies), each checked as
// ReadArtefact checks it.
func ReadProbeReplies(files []string, maxSize int64) ([]ProbeReplies, error) {
	var replies []ProbeReplies
	for _, p := range files {
		data, err := ReadArtefact(p, maxSize)
		if err != nil {
			return nil, err
		}
		pr, err := parseProbeReplies(data, p)
		if err != nil {
			return nil, err
		}
		replies = append(replies, pr)
	}
	return replies, nil
}

// NewPublication checks the rank artefact files (ReadRank) and the worker-probe reply files
// (StatArtefact) of `fpmbus bench publish` and returns what to publish, with MaxSize set, and each
// rank's point count. benchstore.BenchStore.PublishBench reads the files again to publish them (one
// artefact in memory at a time) and refuses one that changed in between.
func NewPublication(files, probes []string, maxSize int64) (benchstore.BenchPublication, []int, error) {
	pub := benchstore.BenchPublication{MaxSize: maxSize}
	var points []int
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return pub, nil, err
		}
		data, sum, err := ReadRank(f, abs, maxSize)
		if err != nil {
			return pub, nil, err
		}
		pub.Ranks = append(pub.Ranks, benchstore.BenchRank{Path: f, Digest: schemas.SHA256Hex(data),
			BenchRankArtefact: benchstore.BenchRankArtefact{RunID: sum.RunID, Rank: sum.Rank, DPSize: sum.DPSize, File: abs}})
		points = append(points, sum.Points)
	}
	for _, p := range probes {
		if _, err := statArtefact(p, maxSize); err != nil {
			return pub, nil, err
		}
		abs, _ := filepath.Abs(p)
		pub.Probes = append(pub.Probes, benchstore.BenchProbe{Path: p, File: abs})
	}
	return pub, points, nil
}
