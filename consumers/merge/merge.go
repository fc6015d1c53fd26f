package merge

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// RankFile is one rank artefact given to Merge.
type RankFile struct {
	// Rank is the DP rank the artefact was supplied as: the rank token of its subject, or N of a
	// "<stem>_dpN<ext>" file name. The document's dp.rank must equal it. -1 takes dp.rank from the document.
	Rank int
	// Path is the artefact's path as the producer wrote it; it is recorded in rank_files and the sidecar.
	Path string
	// Data holds the artefact, or is nil when Load supplies it. Merge does not modify it, and the
	// Result's trees may alias it: do not modify it while the Result is in use.
	Data []byte
	// Load returns the artefact's bytes when Data is nil. Merge calls it twice (run-level fields of every
	// rank first, then one whole rank at a time) and keeps no reference to the bytes, so a large run is
	// merged with one full rank tree in memory besides the reference rank's.
	Load func() ([]byte, error)
	// Size is the artefact's size in bytes when it is known before it is read (the file's size, the
	// message's Fpm-Bench-Size header); 0 when it is not. An artefact whose Size is over the maximum
	// artefact size is rejected without calling Load.
	Size int64
}

func (rf *RankFile) bytes() ([]byte, error) {
	if rf.Data != nil {
		return rf.Data, nil
	}
	if rf.Load == nil {
		return nil, errors.New("merge: rank file has neither Data nor Load")
	}
	return rf.Load()
}

// Options configures Merge.
type Options struct {
	// MergedPath is recorded as merged_output_path (default defaultMergedPath).
	MergedPath string
	// SidecarPath is recorded as worker_probe_path (default sidecarPathFor(MergedPath)).
	SidecarPath string
	// RequireAllRanks rejects a run unless every rank of 0..dp.size-1 is supplied (ruleMissingRanks).
	// Without it a subset merges as Dynamo's node-local merge does: dp.source_ranks lists the ranks
	// supplied, and a rank not supplied gets explicit unavailable warmup evidence.
	RequireAllRanks bool
	// Parallelism bounds how many ranks are read at once (each costs one artefact's bytes in memory)
	// [min(GOMAXPROCS, 4)]. The result does not depend on it.
	Parallelism int
	// MaxArtefactSize rejects a rank artefact larger than this many bytes (RuleArtefactSize), before
	// reading it when its RankFile.Size says so [streams.DefaultBenchMaxArtefact]; negative: no limit.
	MaxArtefactSize int64
}

// defaultMergedPath is Dynamo's default merged artefact path.
const defaultMergedPath = "/tmp/benchmark_results_merged.json"

// result is a successful merge. Nothing has been written yet: see WriteResult.
type result struct {
	RunID       string
	Merged      *schemas.BenchNode
	MergedPath  string
	SidecarPath string
	// Sidecar is the worker-probe sidecar, or nil when the merged artefact has no engine block (then no
	// sidecar is written and worker_probe_path is absent).
	Sidecar *schemas.BenchNode
	// Probe is what buildSidecar needs to recompute the sidecar when more probe replies arrive.
	Probe       probeContext
	SourceRanks []int
	GlobalSize  int
	// CaptureErrors lists the ranks whose engine capture failed or is missing (engine.capture_errors).
	CaptureErrors map[int]string
	// Points is the number of benchmark points (iteration groups).
	Points int
}

// rankInfo is the run-level part of one rank artefact, detached from its source bytes.
type rankInfo struct {
	rf          *RankFile
	rank        int
	runID, grid string
	size        int
	status      string
	stopReason  *schemas.BenchNode
	coverage    *schemas.BenchNode
	expected    int64
	completed   int64
	skipped     int64
	timing      *schemas.BenchNode
	elapsed     float64
	measured    float64
	hasProtocol bool
	protocol    *schemas.BenchNode
	hasExec     bool
	ledger      *schemas.BenchNode // validated warmup_evidence (execution-evidence runs)
	engine      *schemas.BenchNode // nil when absent
}

// Merge validates the rank artefacts of one run against every rule of Dynamo's self-benchmark merge and
// the self-benchmark measurement protocol, and builds the merged artefact and, when it has an engine
// block, the worker-probe sidecar from the probe replies. It returns a *RejectError naming the first rule
// broken (see Rules for the order), or another error when a rank cannot be loaded.
//
// The reference rank is the lowest rank supplied, whatever the order of ranks. The merged artefact is the
// reference rank's document with the merge's fields set (see the package documentation for the key
// order), so fields fpmbus does not know are kept.
func Merge(ranks []RankFile, probes []ProbeReplies, opts Options) (*result, error) {
	if len(ranks) == 0 {
		return nil, &RejectError{Rule: ruleMissingRanks, Detail: "no rank artefacts were supplied"}
	}
	if opts.MergedPath == "" {
		opts.MergedPath = defaultMergedPath
	}
	if opts.SidecarPath == "" {
		opts.SidecarPath = sidecarPathFor(opts.MergedPath)
	}

	workers := opts.Parallelism
	if workers <= 0 {
		workers = min(runtime.GOMAXPROCS(0), 4)
	}
	limit := maxArtefactSize(opts.MaxArtefactSize)

	// Phase 0: sizes known before reading. No rank is read when one is too large.
	for i := range ranks {
		if err := checkSize(&ranks[i], ranks[i].Size, limit); err != nil {
			return nil, err
		}
	}

	// Phase 1: every rank's run-level fields, each rank checked on its own.
	infos := make([]*rankInfo, len(ranks))
	if err := forEach(len(ranks), workers, func(i int) error {
		info, err := loadRankInfo(&ranks[i], limit)
		infos[i] = info
		return err
	}); err != nil {
		return nil, err
	}
	slices.SortStableFunc(infos, func(a, b *rankInfo) int { return a.rank - b.rank })
	for i := 1; i < len(infos); i++ {
		if infos[i].rank == infos[i-1].rank {
			return nil, &RejectError{RunID: infos[i].runID, Rank: intp(infos[i].rank), Rule: ruleDuplicateRank, File: infos[i].rf.Path,
				Detail: fmt.Sprintf("rank %d was supplied twice (%s and %s)", infos[i].rank, infos[i-1].rf.Path, infos[i].rf.Path)}
		}
	}

	// Phase 1b: run-level agreement with the reference rank.
	ref := infos[0]
	m := &merger{ref: ref, infos: infos, opts: opts, runID: ref.runID, grid: ref.grid, size: ref.size}
	if err := m.checkRun(); err != nil {
		return nil, err
	}

	// Phase 2: the reference rank's tree (without its own results, checked in phase 3 like every
	// rank's) and its iteration groups, point by point.
	refData, err := ref.rf.bytes()
	if err != nil {
		return nil, fmt.Errorf("merge: load rank %d (%s): %w", ref.rank, ref.rf.Path, err)
	}
	refDoc, err := parseReference(refData)
	if err != nil {
		return nil, m.reject(ref, "", RuleMalformedJSON, err.Error())
	}
	m.refDoc = refDoc
	if err := m.checkGroups(); err != nil {
		return nil, err
	}

	// Phase 3: every rank's copy of the groups, its timing and its own results, streamed against the
	// reference groups (ranks in parallel; the lowest rank's error is reported).
	regimes := make([]map[int64]schemas.BenchNode, len(infos))
	if err := forEach(len(infos), workers, func(i int) error {
		data := refData
		if infos[i] != ref {
			var err error
			if data, err = infos[i].rf.bytes(); err != nil {
				return fmt.Errorf("merge: load rank %d (%s): %w", infos[i].rank, infos[i].rf.Path, err)
			}
		}
		var err error
		regimes[i], err = m.checkRankResults(infos[i], data)
		return err
	}); err != nil {
		return nil, err
	}
	for i, rg := range regimes {
		for id, reg := range rg {
			if m.regimes == nil {
				m.regimes = map[[2]int64]schemas.BenchNode{}
			}
			m.regimes[[2]int64{int64(infos[i].rank), id}] = reg
		}
	}

	// Phase 4: build.
	return m.build(probes)
}

// forEach runs fn(0..n-1) on up to workers goroutines and returns the error of the lowest index that
// failed, so the outcome does not depend on scheduling.
func forEach(n, workers int, fn func(i int) error) error {
	errs := make([]error, n)
	if workers <= 1 || n <= 1 {
		for i := range n {
			if errs[i] = fn(i); errs[i] != nil {
				return errs[i]
			}
		}
		return nil
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				errs[i] = fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// scanHeader reads a rank artefact's top-level members, keeping only the number of elements of results
// and iteration_groups (as arrays of nulls). The tree aliases data.
func scanHeader(data []byte) (*schemas.BenchNode, error) {
	s := schemas.NewBenchScanner(data)
	k, err := s.Kind()
	if err != nil {
		return nil, err
	}
	if k != schemas.BenchObject {
		if err := s.Skip(); err != nil {
			return nil, err
		}
		return &schemas.BenchNode{Kind: k}, s.Finish()
	}
	return scanMembers(s, func(key string) (schemas.BenchNode, bool, error) {
		if key == "results" || key == "iteration_groups" {
			if k, err := s.Kind(); err == nil && k == schemas.BenchArray {
				n := 0 // only counted here; phase 3 parses or compares every element
				err := s.Array(func(int) error { n++; return s.SkipUnchecked() })
				return schemas.BenchNode{Kind: schemas.BenchArray, Kids: make([]schemas.BenchNode, n)}, true, err
			}
		}
		return schemas.BenchNode{}, false, nil
	})
}

// parseReference builds the reference rank's tree, aliasing data, with an empty placeholder for its
// results (kept in place so the merged artefact's key order is the reference's).
func parseReference(data []byte) (*schemas.BenchNode, error) {
	s := schemas.NewBenchScanner(data)
	return scanMembers(s, func(key string) (schemas.BenchNode, bool, error) {
		if key == "results" {
			return schemas.NewBenchArray(), true, s.Skip()
		}
		return schemas.BenchNode{}, false, nil
	})
}

// scanMembers reads the object at s's position into a tree and finishes s: each member's value is
// what member made of it when it took it (taken), else s parses it in full.
func scanMembers(s *schemas.BenchScanner, member func(key string) (v schemas.BenchNode, taken bool, err error)) (*schemas.BenchNode, error) {
	doc := schemas.NewBenchObject()
	err := s.Object(func(key string) error {
		v, taken, err := member(key)
		if !taken {
			v, err = s.Parse()
		}
		doc.Keys = append(doc.Keys, key)
		doc.Kids = append(doc.Kids, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &doc, s.Finish()
}

type merger struct {
	ref         *rankInfo
	infos       []*rankInfo
	opts        Options
	runID, grid string
	size        int

	anyEngine     bool
	captureErrors map[int]string
	cleanEngine   *rankInfo // first rank (ascending) whose engine capture succeeded

	refDoc    *schemas.BenchNode
	groups    *schemas.BenchNode
	groupByID map[int64]*schemas.BenchNode
	ids       []int64
	measured  float64
	regimes   map[[2]int64]schemas.BenchNode // (rank, benchmark_id) -> kv_seed_regime
}

func (m *merger) reject(info *rankInfo, point string, rule rule, detail string) *RejectError {
	e := &RejectError{RunID: m.runID, Point: point, Rule: rule, Detail: detail}
	if info != nil {
		e.Rank = intp(info.rank)
		e.File = info.rf.Path
	}
	return e
}

func (m *merger) rejectRank(rank int, point string, rule rule, detail string) *RejectError {
	for _, info := range m.infos {
		if info.rank == rank {
			return m.reject(info, point, rule, detail)
		}
	}
	return &RejectError{RunID: m.runID, Rank: intp(rank), Point: point, Rule: rule, Detail: detail}
}

// maxArtefactSize is the limit Options.MaxArtefactSize v sets: the default for 0, none (-1) for a
// negative v.
func maxArtefactSize(v int64) int64 {
	switch {
	case v == 0:
		return streams.DefaultBenchMaxArtefact
	case v < 0:
		return -1
	}
	return v
}

// checkSize rejects rf when size (known before reading, or read) is over limit (RuleArtefactSize).
func checkSize(rf *RankFile, size, limit int64) error {
	err := streams.CheckArtefactSize("rank artefact "+rf.Path, size, limit)
	if err == nil {
		return nil
	}
	e := &RejectError{Rule: RuleArtefactSize, File: rf.Path, Detail: err.Error()}
	if rf.Rank >= 0 {
		e.Rank = intp(rf.Rank)
	}
	return e
}

// loadRankInfo reads the run-level fields of one rank artefact and applies the rules that concern it
// alone (limit is the maximum artefact size, -1 for none). The returned info holds no reference to the
// artefact's bytes.
func loadRankInfo(rf *RankFile, limit int64) (*rankInfo, error) {
	if err := checkSize(rf, rf.Size, limit); err != nil {
		return nil, err
	}
	data, err := rf.bytes()
	if err != nil {
		return nil, fmt.Errorf("merge: load rank artefact %s: %w", rf.Path, err)
	}
	if err := checkSize(rf, int64(len(data)), limit); err != nil {
		return nil, err
	}
	doc, err := scanHeader(data)
	info := &rankInfo{rf: rf, rank: rf.Rank}
	rej := func(rule rule, detail string) *RejectError {
		e := &RejectError{RunID: info.runID, Rule: rule, Detail: detail, File: rf.Path}
		if info.rank >= 0 {
			e.Rank = intp(info.rank)
		}
		return e
	}
	if err != nil {
		return nil, rej(RuleMalformedJSON, err.Error())
	}
	if !doc.IsObject() {
		return nil, rej(RuleMalformedJSON, "top-level value is "+doc.Kind.String()+", not an object")
	}
	if s, ok := doc.Get("run_id").Text(); ok {
		info.runID = strings.Clone(s)
	}
	if v, ok := doc.Get("schema_version").Int(); !ok || v != schemas.BenchArtifactSchemaVersion {
		return nil, rej(ruleSchemaVersion, "schema_version is "+describe(doc.Get("schema_version"))+", want 2")
	}
	if at := doc.Get("artifact_type"); at != nil {
		if s, ok := at.Text(); !ok || s != schemas.BenchArtifactRank {
			return nil, rej(ruleArtifactType, "artifact_type is "+describe(at)+`, want "rank"`)
		}
	}
	if info.runID == "" {
		return nil, rej(ruleMissingRunID, "run_id is "+describe(doc.Get("run_id"))+", want a non-empty string")
	}
	if err := streams.CheckRunID(info.runID); err != nil {
		// The run is not named in the error: a run_id over the limits is what is wrong with it.
		info.runID = ""
		return nil, rej(RuleRunID, "field run_id: "+err.Error())
	}
	grid, ok := doc.Get("grid_digest").Text()
	if !ok || grid == "" {
		return nil, rej(ruleMissingGridDigest, "grid_digest is "+describe(doc.Get("grid_digest"))+", want a non-empty string")
	}
	info.grid = strings.Clone(grid)
	dp := doc.Get("dp")
	size, ok := dp.Get("size").Int()
	if !ok || size < 1 || size > 1<<20 {
		return nil, rej(ruleDPSize, "dp.size is "+describe(dp.Get("size"))+", want an integer >= 1")
	}
	info.size = int(size)
	rank, ok := dp.Get("rank").Int()
	switch {
	case !ok || rank < 0 || rank >= size:
		return nil, rej(ruleRankMismatch, fmt.Sprintf("dp.rank is %s, want an integer in 0..%d", describe(dp.Get("rank")), size-1))
	case rf.Rank >= 0 && rank != int64(rf.Rank):
		return nil, rej(ruleRankMismatch, fmt.Sprintf("dp.rank is %d but the artefact was supplied as rank %d", rank, rf.Rank))
	}
	info.rank = int(rank)

	if err := checkStatus(doc, info, rej); err != nil {
		return nil, err
	}
	if err := checkTiming(doc, info, rej); err != nil {
		return nil, err
	}

	// Measurement protocol, execution-evidence contract and warmup ledger.
	if p := doc.Get("measurement_protocol"); p != nil {
		info.hasProtocol = true
		if v, ok := p.Get("schema_version").Int(); !p.IsObject() || !ok || v != schemas.MeasurementSchemaVersion {
			return nil, rej(ruleProtocolInvalid, "measurement_protocol is not an object with schema_version 1")
		}
		info.protocol = detach(p)
		if ee := p.Get("execution_evidence"); ee != nil {
			info.hasExec = true
			v, ok := ee.Get("schema_version").Int()
			sf, _ := ee.Get("sample_field").Text()
			wf, _ := ee.Get("warmup_field").Text()
			if !ee.IsObject() || !ok || v != 1 || sf != "benchmark_sample" || wf != "warmup_evidence" {
				return nil, rej(ruleExecutionContract, `measurement_protocol.execution_evidence must be an object with schema_version 1, sample_field "benchmark_sample" and warmup_field "warmup_evidence"`)
			}
		}
	}
	if info.hasExec {
		if detail := checkLedger(doc.Get("warmup_evidence")); detail != "" {
			return nil, rej(ruleWarmupEvidence, detail)
		}
		info.ledger = detach(doc.Get("warmup_evidence"))
	} else if doc.Has("warmup_evidence") {
		return nil, rej(ruleExecutionContract, "warmup_evidence is present but measurement_protocol declares no execution_evidence contract")
	}
	if e := doc.Get("engine"); e != nil {
		info.engine = detach(e)
	}
	return info, nil
}

// checkStatus applies Dynamo's status and coverage rules to one rank artefact.
func checkStatus(doc *schemas.BenchNode, info *rankInfo, rej func(rule, string) *RejectError) error {
	status := "failed"
	if v, ok := doc.Get("valid").Bool(); ok && v {
		status = schemas.BenchStatusComplete
	}
	if st := doc.Get("status"); st != nil {
		status, _ = st.Text()
		if status == "" {
			status = describe(st)
		}
	}
	if status != schemas.BenchStatusComplete && status != schemas.BenchStatusPartial {
		return rej(ruleStatus, fmt.Sprintf("status is %q, want complete or partial", status))
	}
	info.status = strings.Clone(status)
	cov := doc.Get("coverage")
	if !cov.IsObject() {
		return rej(ruleCoverageArithmetic, "coverage is "+describe(cov)+", want an object")
	}
	exp, ok1 := cov.Get("expected_points").Int()
	comp, ok2 := cov.Get("completed_points").Int()
	skip, ok3 := cov.Get("skipped_points").Int()
	switch {
	case !ok1 || !ok2 || !ok3:
		return rej(ruleCoverageArithmetic, "coverage expected_points, completed_points and skipped_points must be integers")
	case min(exp, comp, skip) < 0:
		return rej(ruleCoverageArithmetic, fmt.Sprintf("coverage has a negative count (expected %d, completed %d, skipped %d)", exp, comp, skip))
	case comp+skip > exp:
		return rej(ruleCoverageArithmetic, fmt.Sprintf("completed %d + skipped %d exceeds expected %d", comp, skip, exp))
	}
	info.coverage, info.expected, info.completed, info.skipped = detach(cov), exp, comp, skip
	sp := doc.Get("skipped_points")
	if sp == nil {
		sp = &schemas.BenchNode{Kind: schemas.BenchArray}
	}
	mp := doc.Get("missing_phases")
	if mp == nil {
		mp = &schemas.BenchNode{Kind: schemas.BenchArray}
	}
	results, groups := doc.Get("results"), doc.Get("iteration_groups")
	switch {
	case !sp.IsArray() || int64(sp.Len()) != skip:
		return rej(ruleCoverageArithmetic, fmt.Sprintf("skipped_points has %s, coverage says %d", countOf(sp), skip))
	case !mp.IsArray():
		return rej(ruleCoverageArithmetic, "missing_phases is "+describe(mp)+", want a list")
	case !results.IsArray() || int64(results.Len()) != comp:
		return rej(ruleCoverageArithmetic, fmt.Sprintf("results has %s, coverage says %d completed", countOf(results), comp))
	case !groups.IsArray() || int64(groups.Len()) != comp:
		return rej(ruleCoverageArithmetic, fmt.Sprintf("iteration_groups has %s, coverage says %d completed", countOf(groups), comp))
	}
	valid, validOK := doc.Get("valid").Bool()
	usable, usableOK := doc.Get("usable").Bool()
	stop := doc.Get("stop_reason")
	errNode := doc.Get("error")
	info.stopReason = detach(stop)
	if status == schemas.BenchStatusComplete {
		switch {
		case !validOK || !valid:
			return rej(ruleStatus, "complete status needs valid true, got "+describe(doc.Get("valid")))
		case doc.Has("usable") && (!usableOK || !usable):
			return rej(ruleStatus, "complete status needs usable true, got "+describe(doc.Get("usable")))
		case !stop.IsNull():
			return rej(ruleStatus, "complete status needs stop_reason null, got "+describe(stop))
		case comp != exp:
			return rej(ruleStatus, fmt.Sprintf("complete status needs every expected point completed (%d of %d)", comp, exp))
		}
	} else {
		sr, _ := stop.Text()
		switch {
		case !validOK || valid:
			return rej(ruleStatus, "partial status needs valid false, got "+describe(doc.Get("valid")))
		case !usableOK || !usable:
			return rej(ruleStatus, "partial status needs usable true, got "+describe(doc.Get("usable")))
		case sr != "timeout":
			return rej(ruleStatus, `partial status needs stop_reason "timeout", got `+describe(stop))
		case comp >= exp:
			return rej(ruleStatus, fmt.Sprintf("partial status needs fewer completed than expected points (%d of %d)", comp, exp))
		}
	}
	// Both statuses: what was skipped, missing or failed makes neither.
	switch {
	case skip != 0:
		return rej(ruleStatus, fmt.Sprintf("%s status needs no skipped points (%d)", status, skip))
	case mp.Len() > 0:
		return rej(ruleStatus, fmt.Sprintf("%s status needs no missing phases (%d)", status, mp.Len()))
	case !errNode.IsNull():
		return rej(ruleStatus, status+" status needs error null, got "+describe(errNode))
	}
	return nil
}

func checkTiming(doc *schemas.BenchNode, info *rankInfo, rej func(rule, string) *RejectError) error {
	t := doc.Get("timing")
	if !t.IsObject() {
		return rej(ruleTimingInvalid, "timing is "+describe(t)+", want an object")
	}
	_, ok1 := t.Get("started_at").Text()
	_, ok2 := t.Get("completed_at").Text()
	if !ok1 || !ok2 {
		return rej(ruleTimingInvalid, "timing.started_at and timing.completed_at must be strings")
	}
	el, ok := t.Get("benchmark_elapsed_seconds").FiniteFloat()
	if !ok || el < 0 {
		return rej(ruleTimingInvalid, "timing.benchmark_elapsed_seconds is "+describe(t.Get("benchmark_elapsed_seconds"))+", want a finite number >= 0")
	}
	ms, ok := t.Get("measured_iteration_seconds").FiniteFloat()
	if !ok {
		return rej(ruleTimingInvalid, "timing.measured_iteration_seconds is "+describe(t.Get("measured_iteration_seconds"))+", want a finite number")
	}
	info.timing, info.elapsed, info.measured = detach(t), el, ms
	return nil
}

// checkRun applies the run-level rules: every rank agrees with the reference rank.
func (m *merger) checkRun() error {
	ref := m.ref
	for _, info := range m.infos[1:] {
		switch {
		case info.runID != ref.runID:
			return m.reject(info, "", ruleRunMismatch, fmt.Sprintf("run_id %q differs from rank %d's %q", info.runID, ref.rank, ref.runID))
		case info.grid != ref.grid:
			return m.reject(info, "", ruleGridMismatch, fmt.Sprintf("grid_digest %q differs from rank %d's %q", info.grid, ref.rank, ref.grid))
		case info.size != ref.size:
			return m.reject(info, "", ruleDPSizeMismatch, fmt.Sprintf("dp.size %d differs from rank %d's %d", info.size, ref.rank, ref.size))
		}
	}
	if m.opts.RequireAllRanks {
		var missing []int
		have := make(map[int]bool, len(m.infos))
		for _, info := range m.infos {
			have[info.rank] = true
		}
		for r := range m.size {
			if !have[r] {
				missing = append(missing, r)
			}
		}
		if len(missing) > 0 {
			return &RejectError{RunID: m.runID, Rule: ruleMissingRanks, Detail: fmt.Sprintf("ranks %v of dp.size %d were not supplied", missing, m.size)}
		}
	}
	for _, info := range m.infos[1:] {
		if info.hasProtocol != ref.hasProtocol {
			with, without := info, ref
			if ref.hasProtocol {
				with, without = ref, info
			}
			return m.reject(info, "", ruleLegacyProtocolMix, fmt.Sprintf("rank %d has a measurement_protocol but rank %d is a legacy artefact without one", with.rank, without.rank))
		}
		if ref.hasProtocol {
			if d := schemas.BenchDiff(ref.protocol, info.protocol); d != "" {
				return m.reject(info, "", ruleProtocolMismatch, fmt.Sprintf("measurement_protocol differs from rank %d's at %s", ref.rank, d))
			}
		}
	}
	for _, info := range m.infos[1:] {
		switch {
		case info.status != ref.status:
			return m.reject(info, "", ruleStatusMismatch, fmt.Sprintf("status %q differs from rank %d's %q", info.status, ref.rank, ref.status))
		case !schemas.BenchEqual(nullIfNil(info.stopReason), nullIfNil(ref.stopReason)):
			return m.reject(info, "", ruleStatusMismatch, fmt.Sprintf("stop_reason %s differs from rank %d's %s", describe(info.stopReason), ref.rank, describe(ref.stopReason)))
		}
		if d := schemas.BenchDiff(ref.coverage, info.coverage); d != "" {
			return m.reject(info, "", ruleCoverageMismatch, fmt.Sprintf("coverage differs from rank %d's at %s", ref.rank, d))
		}
	}
	return m.checkEngines()
}

// Post-run fields excluded from the engine identity comparison.
var (
	enginePostRunFields    = []string{"resolved", "resolution", "resolved_scope", "worker_probe"}
	attentionResolveFields = []string{"backend_resolved", "mla_prefill_backend_resolved", "resolution"}
)

// engineDegraded: no engine block, or a capture that raised partway (capture_error present).
func engineDegraded(e *schemas.BenchNode) bool { return !e.IsObject() || e.Has("capture_error") }

// engineIdentity is the part of an engine block every rank must agree on.
func engineIdentity(e *schemas.BenchNode) schemas.BenchNode {
	id := e.ShallowCopy()
	for _, f := range enginePostRunFields {
		id.Delete(f)
	}
	if a := id.Get("attention"); a.IsObject() {
		ac := a.ShallowCopy()
		for _, f := range attentionResolveFields {
			ac.Delete(f)
		}
		id.Set("attention", ac)
	}
	if p := id.Get("parallel"); p.IsObject() {
		pc := p.ShallowCopy()
		pc.Delete("data_parallel_rank")
		id.Set("parallel", pc)
	}
	return id
}

func (m *merger) checkEngines() error {
	for _, info := range m.infos {
		if info.engine.IsObject() {
			m.anyEngine = true
		}
	}
	if !m.anyEngine {
		return nil
	}
	m.captureErrors = map[int]string{}
	var refID schemas.BenchNode
	for _, info := range m.infos {
		e := info.engine
		if engineDegraded(e) {
			msg := schemas.EngineMissingBlock
			if e.IsObject() {
				ce := e.Get("capture_error")
				if s, ok := ce.Text(); ok {
					msg = s
				} else {
					msg = string(schemas.AppendBenchCompact(nil, ce))
				}
			}
			m.captureErrors[info.rank] = msg
			continue
		}
		if m.cleanEngine == nil {
			m.cleanEngine = info
			refID = engineIdentity(e)
			continue
		}
		id := engineIdentity(e)
		if d := schemas.BenchDiff(&refID, &id); d != "" {
			return m.reject(info, "", ruleEngineMismatch, fmt.Sprintf("engine field %s differs from rank %d's; the ranks of one run must share a startup engine configuration", d, m.cleanEngine.rank))
		}
	}
	return nil
}

// checkGroups validates the reference rank's iteration groups: ids, ranks, FPMs, wall times and, with a
// measurement protocol, the evidence of every member of every group.
func (m *merger) checkGroups() error {
	ref := m.ref
	groups := m.refDoc.Get("iteration_groups")
	if !groups.IsArray() || groups.Len() == 0 {
		return m.reject(ref, "", ruleMissingIterationGroups, "the reference rank has no synchronised iteration groups")
	}
	m.groups = groups
	m.groupByID = make(map[int64]*schemas.BenchNode, groups.Len())
	prevForward := make(map[int]int64, m.size)
	ledgers := make(map[int]*schemas.BenchNode, len(m.infos))
	for _, info := range m.infos {
		if info.ledger != nil {
			ledgers[info.rank] = info.ledger
		}
	}
	for gi := range groups.Kids {
		g := &groups.Kids[gi]
		id, ok := g.Get("benchmark_id").Int()
		if !ok || id < 1 {
			return m.reject(ref, "", ruleBenchmarkID, fmt.Sprintf("iteration group %d has benchmark_id %s, want an integer >= 1", gi, describe(g.Get("benchmark_id"))))
		}
		pt := pointName(id)
		if _, dup := m.groupByID[id]; dup {
			return m.reject(ref, pt, ruleDuplicateBenchmarkID, fmt.Sprintf("benchmark_id %d names two iteration groups", id))
		}
		point := g.Get("point")
		if pid, ok := point.Get("benchmark_id").Int(); !ok || pid != id {
			return m.reject(ref, pt, ruleBenchmarkID, fmt.Sprintf("iteration group %d's point has benchmark_id %s", id, describe(point.Get("benchmark_id"))))
		}
		if !isRankList(g.Get("expected_dp_ranks"), m.size) {
			return m.reject(ref, pt, ruleGroupRanks, fmt.Sprintf("expected_dp_ranks is %s, want 0..%d", describe(g.Get("expected_dp_ranks")), m.size-1))
		}
		if c, _ := g.Get("complete").Bool(); !c {
			return m.reject(ref, pt, ruleGroupRanks, "the iteration group is not complete")
		}
		rr := g.Get("rank_results")
		if !rr.IsArray() {
			return m.reject(ref, pt, ruleGroupRanks, "rank_results is "+describe(rr)+", want a list")
		}
		if rr.Len() != m.size {
			return m.reject(ref, pt, ruleGroupRanks, fmt.Sprintf("rank_results has %d ranks, want 0..%d", rr.Len(), m.size-1))
		}
		maxWall := 0.0
		pointKey := ""
		for r := range rr.Kids {
			res := &rr.Kids[r]
			if v, ok := res.Get("dp_rank").Int(); !ok || v != int64(r) {
				return m.reject(ref, pt, ruleGroupRanks, fmt.Sprintf("rank_results[%d] has dp_rank %s, want %d", r, describe(res.Get("dp_rank")), r))
			}
			fpm, detail := oneFPM(res.Get("fpms"), id, r)
			if detail != "" {
				return m.rejectRank(r, pt, ruleRankPointFPM, detail)
			}
			wall, _ := fpm.Get("wall_time").FiniteFloat()
			maxWall = max(maxWall, wall)
			meas := fpm.Get("benchmark_measurement")
			if !ref.hasProtocol {
				if meas != nil {
					return m.rejectRank(r, pt, ruleMeasurementWithoutProtocol, "the FPM carries benchmark_measurement but the run has no shared measurement_protocol")
				}
				continue
			}
			if v, ok := meas.Get("schema_version").Int(); !meas.IsObject() || !ok || v != schemas.MeasurementSchemaVersion {
				return m.rejectRank(r, pt, ruleMissingGroupEvidence, "benchmark_measurement is missing or has no schema_version 1; every member of a synchronised group needs point/rank evidence")
			}
			if v, ok := meas.Get("dp_rank").Int(); !ok || v != int64(r) {
				return m.rejectRank(r, pt, ruleMissingGroupEvidence, fmt.Sprintf("benchmark_measurement.dp_rank is %s, want %d", describe(meas.Get("dp_rank")), r))
			}
			key, ok := meas.Get("point_key").Text()
			if !ok || key == "" {
				return m.rejectRank(r, pt, ruleMeasurementIdentity, "benchmark_measurement.point_key is "+describe(meas.Get("point_key"))+", want a non-empty string")
			}
			if r == 0 {
				pointKey = key
			} else if key != pointKey {
				return m.rejectRank(r, pt, ruleMeasurementIdentity, fmt.Sprintf("point_key %q differs from rank 0's %q for the same point", key, pointKey))
			}
			prep := meas.Get("preparation")
			if gd, ok := prep.Get("grid_digest").Text(); !prep.IsObject() || !ok || gd != m.grid {
				return m.rejectRank(r, pt, ruleMeasurementIdentity, fmt.Sprintf("preparation.grid_digest is %s, want the run's %q", describe(prep.Get("grid_digest")), m.grid))
			}
			if !ref.hasExec {
				for si := range meas.Get("raw_fpms").Len() {
					if meas.Get("raw_fpms").Kids[si].Has("benchmark_sample") {
						return m.rejectRank(r, pt, ruleExecutionContract, "raw samples carry benchmark_sample but measurement_protocol declares no execution_evidence contract")
					}
				}
				continue
			}
			prev, seen := prevForward[r]
			if !seen {
				prev = -1
			}
			last, rule, detail := checkExecution(fpm, meas, id, r, prev)
			if rule != "" {
				return m.rejectRank(r, pt, rule, detail)
			}
			prevForward[r] = last
			if detail := checkWarmupReference(meas, ledgers[r]); detail != "" {
				return m.rejectRank(r, pt, ruleWarmupReference, detail)
			}
		}
		gw, ok := g.Get("wall_time").FiniteFloat()
		if !ok || gw != maxWall {
			return m.reject(ref, pt, ruleGroupWallTime, fmt.Sprintf("group wall_time is %s, want the maximum rank wall time %s", describe(g.Get("wall_time")), fmtFloat(maxWall)))
		}
		if maxWall <= 0 {
			return m.reject(ref, pt, ruleGroupWallTime, "the maximum rank wall time is 0; a published latency must be positive")
		}
		m.groupByID[id] = g
		m.ids = append(m.ids, id)
		m.measured += gw
	}
	sorted := slices.Clone(m.ids)
	slices.Sort(sorted)
	for i, id := range sorted {
		if id != int64(i+1) {
			return m.reject(ref, pointName(id), ruleNonContiguousBenchmarkIDs, fmt.Sprintf("benchmark ids %s are not the contiguous sequence 1..%d", idList(sorted), len(sorted)))
		}
	}
	m.ids = sorted
	return nil
}

// oneFPM returns the only FPM of a rank-point, or why there is not exactly one valid one.
func oneFPM(fpms *schemas.BenchNode, id int64, rank int) (*schemas.BenchNode, string) {
	if !fpms.IsArray() || fpms.Len() != 1 {
		return nil, fmt.Sprintf("fpms has %s, want exactly one FPM per rank and point", countOf(fpms))
	}
	fpm := &fpms.Kids[0]
	if c, ok := fpm.Get("counter_id").Int(); !ok || c != id {
		return nil, fmt.Sprintf("FPM counter_id is %s, want the benchmark_id %d", describe(fpm.Get("counter_id")), id)
	}
	if r, ok := fpm.Get("dp_rank").Int(); !ok || r != int64(rank) {
		return nil, fmt.Sprintf("FPM dp_rank is %s, want %d", describe(fpm.Get("dp_rank")), rank)
	}
	if w, ok := fpm.Get("wall_time").FiniteFloat(); !ok || w < 0 {
		return nil, "FPM wall_time is " + describe(fpm.Get("wall_time")) + ", want a finite number >= 0"
	}
	return fpm, ""
}

// errStopScan ends a scan early; the reason is recorded by the caller.
var errStopScan = errors.New("merge: stop scan")

// checkRankResults streams one rank artefact against the reference groups: its copy of the groups must
// be identical, its timing must add up, and its own results must be exactly one FPM per benchmark id,
// equal to its copy in the synchronised group. It returns the rank's kv_seed_regime per benchmark id,
// detached from data. Problems are reported in this order: groups, timing, results.
func (m *merger) checkRankResults(info *rankInfo, data []byte) (map[int64]schemas.BenchNode, error) {
	var groupsErr, resultsErr error
	seen := make(map[int64]bool, len(m.ids))
	regimes := map[int64]schemas.BenchNode{}
	s := schemas.NewBenchScanner(data)
	err := s.Object(func(key string) error {
		switch key {
		case "iteration_groups":
			if info == m.ref {
				return s.Skip()
			}
			d, err := s.Compare(m.groups)
			if err != nil {
				return err
			}
			if d != "" {
				groupsErr = m.reject(info, groupPointAt(m.groups, d), ruleIterationGroupsMismatch,
					fmt.Sprintf("iteration_groups%s differs from rank %d's synchronised groups", pathSuffix(d), m.ref.rank))
				return errStopScan
			}
			return nil
		case "results":
			return s.Array(func(i int) error {
				res, err := s.Parse()
				if err != nil || resultsErr != nil {
					return err
				}
				resultsErr = m.checkResult(info, i, &res, seen, regimes)
				return nil
			})
		}
		return s.Skip()
	})
	if err == nil {
		err = s.Finish()
	}
	switch {
	case groupsErr != nil:
		return nil, groupsErr
	case err != nil:
		return nil, m.reject(info, "", RuleMalformedJSON, err.Error())
	}
	if !isClose(info.measured, m.measured, 1e-9, 1e-12) {
		return nil, m.reject(info, "", ruleMeasuredTime, fmt.Sprintf("timing.measured_iteration_seconds %s is not the sum of the group wall times %s", fmtFloat(info.measured), fmtFloat(m.measured)))
	}
	if info.measured > info.elapsed+1e-12 {
		return nil, m.reject(info, "", ruleMeasuredTime, fmt.Sprintf("timing.measured_iteration_seconds %s exceeds benchmark_elapsed_seconds %s", fmtFloat(info.measured), fmtFloat(info.elapsed)))
	}
	if resultsErr != nil {
		return nil, resultsErr
	}
	for _, id := range m.ids {
		if !seen[id] {
			return nil, m.reject(info, pointName(id), ruleResultIDSet, fmt.Sprintf("results have no entry for benchmark_id %d", id))
		}
	}
	return regimes, nil
}

// checkResult checks results[i] of a rank against its group.
func (m *merger) checkResult(info *rankInfo, i int, res *schemas.BenchNode, seen map[int64]bool, regimes map[int64]schemas.BenchNode) error {
	id, ok := res.Get("point").Get("benchmark_id").Int()
	if !ok {
		return m.reject(info, "", ruleResultIDSet, fmt.Sprintf("results[%d].point.benchmark_id is %s", i, describe(res.Get("point").Get("benchmark_id"))))
	}
	pt := pointName(id)
	if seen[id] {
		return m.reject(info, pt, ruleResultIDSet, fmt.Sprintf("benchmark_id %d appears twice in results", id))
	}
	seen[id] = true
	g, ok := m.groupByID[id]
	if !ok {
		return m.reject(info, pt, ruleResultIDSet, fmt.Sprintf("results[%d] names benchmark_id %d, which has no iteration group (ids are %s)", i, id, idList(m.ids)))
	}
	if d := schemas.BenchDiff(g.Get("point"), res.Get("point")); d != "" {
		return m.reject(info, pt, rulePointMismatch, "the result's point differs from its iteration group's at "+d)
	}
	if _, detail := oneFPM(res.Get("fpms"), id, info.rank); detail != "" {
		return m.reject(info, pt, ruleRankPointFPM, detail)
	}
	groupFPMs := g.Get("rank_results").Kids[info.rank].Get("fpms")
	if d := schemas.BenchDiff(groupFPMs, res.Get("fpms")); d != "" {
		return m.reject(info, pt, ruleLocalResultMismatch, "the rank's own FPM differs from its copy in the synchronised group at fpms"+pathSuffix(d))
	}
	if reg := res.Get("kv_seed_regime"); reg != nil {
		regimes[id] = *detach(reg)
	}
	return nil
}

// build assembles the merged artefact and the sidecar.
func (m *merger) build(probes []ProbeReplies) (*result, error) {
	ref := m.ref
	merged := m.refDoc.ShallowCopy()
	globalRanks := make([]int, m.size)
	for i := range globalRanks {
		globalRanks[i] = i
	}
	sourceRanks := make([]int, len(m.infos))
	rankFiles := make([]string, len(m.infos))
	for i, info := range m.infos {
		sourceRanks[i] = info.rank
		rankFiles[i] = info.rf.Path
	}

	if m.anyEngine {
		if engineDegraded(ref.engine) && m.cleanEngine != nil {
			merged.Set("engine", *m.cleanEngine.engine)
		}
		if e := merged.Get("engine"); e.IsObject() {
			ec := e.ShallowCopy()
			if p := ec.Get("parallel"); p.IsObject() {
				pc := p.ShallowCopy()
				pc.Set("data_parallel_rank", schemas.NewBenchNull())
				ec.Set("parallel", pc)
			}
			merged.Set("engine", ec)
		}
		if len(m.captureErrors) > 0 {
			if !merged.Get("engine").IsObject() {
				merged.Set("engine", schemas.NewBenchObject())
			}
			ce := schemas.NewBenchObject()
			for _, r := range slices.Sorted(maps.Keys(m.captureErrors)) {
				ce.Set(strconv.Itoa(r), schemas.NewBenchString(m.captureErrors[r]))
			}
			merged.Get("engine").Set("capture_errors", ce)
		}
	}
	merged.Set("artifact_type", schemas.NewBenchString(schemas.BenchArtifactMerged))
	dp := schemas.NewBenchObject()
	dp.Set("ranks", intArray(globalRanks))
	dp.Set("source_ranks", intArray(sourceRanks))
	dp.Set("managed_size", schemas.NewBenchInt(int64(len(sourceRanks))))
	dp.Set("global_size", schemas.NewBenchInt(int64(m.size)))
	merged.Set("dp", dp)
	files := schemas.NewBenchArray()
	for _, f := range rankFiles {
		files.Append(schemas.NewBenchString(f))
	}
	merged.Set("rank_files", files)
	merged.Set("merged_output_path", schemas.NewBenchString(m.opts.MergedPath))
	hasEngine := merged.Get("engine").IsObject()
	if hasEngine {
		merged.SetAfter("merged_output_path", "worker_probe_path", schemas.NewBenchString(m.opts.SidecarPath))
	}

	flat := schemas.BenchNode{Kind: schemas.BenchArray, Kids: make([]schemas.BenchNode, 0, len(m.ids)*m.size)}
	for _, id := range m.ids {
		g := m.groupByID[id]
		rr := g.Get("rank_results")
		for r := range rr.Kids {
			point := g.Get("point").ShallowCopy()
			point.Set("dp_rank", schemas.NewBenchInt(int64(r)))
			entry := schemas.NewBenchObject()
			entry.Set("point", point)
			entry.Set("fpms", *rr.Kids[r].Get("fpms"))
			if reg, ok := m.regimes[[2]int64{int64(r), id}]; ok {
				entry.Set("kv_seed_regime", reg)
			}
			flat.Append(entry)
		}
	}
	merged.Set("results", flat)
	merged.Set("iteration_groups", *m.groups)
	if ref.hasExec {
		merged.Delete("warmup_evidence")
		rwe := schemas.NewBenchObject()
		ledgers := map[int]*schemas.BenchNode{}
		for _, info := range m.infos {
			ledgers[info.rank] = info.ledger
		}
		for _, r := range globalRanks {
			if l := ledgers[r]; l != nil {
				rwe.Set(strconv.Itoa(r), *l)
				continue
			}
			un := schemas.NewBenchObject()
			un.Set("status", schemas.NewBenchString("unavailable"))
			un.Set("records", schemas.NewBenchArray())
			un.Set("reason", schemas.NewBenchString(schemas.WarmupUnavailableReasonNotLoaded))
			rwe.Set(strconv.Itoa(r), un)
		}
		merged.Set("rank_warmup_evidence", rwe)
	}
	slowest := m.infos[0]
	for _, info := range m.infos[1:] {
		if info.elapsed > slowest.elapsed {
			slowest = info
		}
	}
	timing := slowest.timing.ShallowCopy()
	timing.Set("benchmark_elapsed_seconds", schemas.NewBenchFloat(slowest.elapsed))
	timing.Set("measured_iteration_seconds", schemas.NewBenchFloat(m.measured))
	rbe := schemas.NewBenchObject()
	for _, info := range m.infos {
		rbe.Set(strconv.Itoa(info.rank), schemas.NewBenchFloat(info.elapsed))
	}
	timing.Set("rank_benchmark_elapsed_seconds", rbe)
	merged.Set("timing", timing)
	cov := schemas.NewBenchObject()
	gs := int64(m.size)
	cov.Set("expected_points", schemas.NewBenchInt(ref.expected*gs))
	cov.Set("completed_points", schemas.NewBenchInt(ref.completed*gs))
	cov.Set("skipped_points", schemas.NewBenchInt(ref.skipped*gs))
	merged.Set("coverage", cov)
	if sp := m.refDoc.Get("skipped_points"); sp != nil {
		merged.Set("skipped_points", *sp)
	} else {
		merged.Set("skipped_points", schemas.NewBenchArray())
	}

	res := &result{
		RunID:         m.runID,
		Merged:        &merged,
		MergedPath:    m.opts.MergedPath,
		SidecarPath:   m.opts.SidecarPath,
		SourceRanks:   sourceRanks,
		GlobalSize:    m.size,
		CaptureErrors: m.captureErrors,
		Points:        len(m.ids),
	}
	if hasEngine {
		res.Probe = newProbeContext(m.runID, m.opts.MergedPath, m.opts.SidecarPath, rankFiles, sourceRanks, globalRanks, merged.Get("engine"))
		res.Sidecar = buildSidecar(res.Probe, probes)
	}
	return res, nil
}

// --- helpers ---

// detach returns a deep copy of n whose strings do not share memory with the parsed source, so keeping
// it does not keep a whole artefact's bytes alive. nil stays nil.
func detach(n *schemas.BenchNode) *schemas.BenchNode {
	if n == nil {
		return nil
	}
	c := detachValue(n)
	return &c
}

func detachValue(n *schemas.BenchNode) schemas.BenchNode {
	c := schemas.BenchNode{Kind: n.Kind, Str: strings.Clone(n.Str)}
	if n.Keys != nil {
		c.Keys = make([]string, len(n.Keys))
		for i, k := range n.Keys {
			c.Keys[i] = strings.Clone(k)
		}
	}
	if n.Kids != nil {
		c.Kids = make([]schemas.BenchNode, len(n.Kids))
		for i := range n.Kids {
			c.Kids[i] = detachValue(&n.Kids[i])
		}
	}
	return c
}

func nullIfNil(n *schemas.BenchNode) *schemas.BenchNode {
	if n == nil {
		return &schemas.BenchNode{}
	}
	return n
}

// describe renders a value for an error message: missing, its compact JSON (shortened), or its kind.
func describe(n *schemas.BenchNode) string {
	if n == nil {
		return "missing"
	}
	if n.Kind == schemas.BenchArray || n.Kind == schemas.BenchObject {
		if n.Raw() || n.Len() > 8 {
			return "a " + n.Kind.String()
		}
	}
	s := string(schemas.AppendBenchCompact(nil, n))
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func countOf(n *schemas.BenchNode) string {
	if !n.IsArray() {
		return describe(n) + " instead of a list"
	}
	return strconv.Itoa(n.Len()) + " entries"
}

func isRankList(n *schemas.BenchNode, size int) bool {
	if !n.IsArray() || n.Len() != size {
		return false
	}
	for i := range n.Kids {
		if v, ok := n.Kids[i].Int(); !ok || v != int64(i) {
			return false
		}
	}
	return true
}

func intArray(v []int) schemas.BenchNode {
	a := schemas.BenchNode{Kind: schemas.BenchArray, Kids: make([]schemas.BenchNode, len(v))}
	for i, x := range v {
		a.Kids[i] = schemas.NewBenchInt(int64(x))
	}
	return a
}

func idList(ids []int64) string {
	if len(ids) > 12 {
		return fmt.Sprint(ids[:12])[:len(fmt.Sprint(ids[:12]))-1] + " ...]"
	}
	return fmt.Sprint(ids)
}

// isClose is Python's math.isclose.
func isClose(a, b, rel, abs float64) bool {
	if a == b {
		return true
	}
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		return false
	}
	d := math.Abs(a - b)
	return d <= max(rel*max(math.Abs(a), math.Abs(b)), abs)
}

func fmtFloat(f float64) string { return string(schemas.AppendPythonFloat(nil, f)) }

func pathSuffix(d string) string {
	if d == "." {
		return ""
	}
	if strings.HasPrefix(d, "[") {
		return d
	}
	return "." + d
}

// groupPointAt names the benchmark_id of the group at the start of a diff path like "[3].rank_results...".
func groupPointAt(groups *schemas.BenchNode, d string) string {
	if !strings.HasPrefix(d, "[") {
		return ""
	}
	end := strings.IndexByte(d, ']')
	i, err := strconv.Atoi(d[1:max(end, 1)])
	if err != nil || i < 0 || i >= groups.Len() {
		return ""
	}
	if id, ok := groups.Kids[i].Get("benchmark_id").Int(); ok {
		return pointName(id)
	}
	return ""
}
