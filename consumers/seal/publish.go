package seal

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/fpmbus/fpmbus/schemas"
)

// errPartial: a publication with AllowPartial sealed the cells that passed, but the campaign is
// incomplete (missing cells are recorded). Commands exit with exitPartial.
var errPartial = errors.New("seal: partial publication, campaign incomplete")

// errIncomplete: without AllowPartial, every frozen cell must be in the dataset; nothing was written.
var errIncomplete = errors.New("seal: dataset does not cover the frozen plan")

// Exit statuses of `fpmbus seal`-family commands for outcomes that are not plain failures.
const (
	exitPartial  = 3 // --allow-partial: passed cells sealed, others missing
	exitConflict = 4 // at least one cell was sealed first by a different attempt
)

// partialError lists the cells left missing by a partial publication.
type partialError struct {
	CampaignID string
	Sealed     int
	Missing    []string
}

func (e *partialError) Error() string {
	return fmt.Sprintf("%v: campaign %s: %d cell(s) sealed, %d missing: %s", errPartial, e.CampaignID, e.Sealed,
		len(e.Missing), strings.Join(e.Missing, ", "))
}
func (e *partialError) Unwrap() error { return errPartial }
func (e *partialError) ExitCode() int { return exitPartial }

// conflictsError collects the conflicts of one publication.
type conflictsError struct{ Conflicts []*conflictError }

func (e *conflictsError) Error() string {
	parts := make([]string, len(e.Conflicts))
	for i, c := range e.Conflicts {
		parts[i] = c.Error()
	}
	return fmt.Sprintf("%d conflict(s): %s", len(e.Conflicts), strings.Join(parts, "; "))
}

// Unwrap is ErrConflict and each conflict, so errors.Is(err, ErrSealMissing) finds a refusal of a
// missing cell among them.
func (e *conflictsError) Unwrap() []error {
	errs := make([]error, 0, 1+len(e.Conflicts))
	errs = append(errs, ErrConflict)
	for _, c := range e.Conflicts {
		errs = append(errs, c)
	}
	return errs
}
func (e *conflictsError) ExitCode() int { return exitConflict }

// PublishOptions controls PublishDataset.
type PublishOptions struct {
	// AllowPartial seals the cells that pass even when others are rejected or missing; the campaign
	// records every missing cell and stays incomplete, and the result is a *partialError (exitPartial).
	AllowPartial bool
	// Plan is the frozen plan the dataset belongs to; nil means a plan of exactly the dataset's cells.
	Plan *schemas.DatasetPlan
	// Concurrency bounds parallel seals (default 8).
	Concurrency int
	// Progress, when set, is called after each cell is settled (sealed, refused or failed) with the
	// cells settled so far and the cells to seal (the dataset's, less those rejected); calls are
	// serialised.
	Progress func(done, total int)
}

// Cell states in a Report besides the seal Results.
const (
	stateRejected = "rejected"
	stateMissing  = "missing"
)

// cellReport is one cell's outcome, with the fields every result shows: source, run, dataset digest, cell
// identity, state, and a reason when the cell was not sealed.
type cellReport struct {
	Key           string                `json:"key"`
	State         string                `json:"state"`
	Source        string                `json:"source,omitempty"`
	RunID         string                `json:"run_id,omitempty"`
	DatasetDigest string                `json:"dataset_digest,omitempty"`
	Revision      uint64                `json:"revision,omitempty"`
	Identity      *schemas.CellIdentity `json:"identity,omitempty"`
	Reason        string                `json:"reason,omitempty"`
}

// report is the outcome of one publication.
type report struct {
	RunID      string                  `json:"run_id"`
	CampaignID string                  `json:"campaign_id"`
	Campaign   string                  `json:"campaign_state"`
	Cells      []cellReport            `json:"cells"`
	Rejections []*schemas.DatasetError `json:"rejections,omitempty"`
}

var campaignIDRe = regexp.MustCompile(`^[-_=a-zA-Z0-9.]{1,200}$`)

// CampaignIDFor is the campaign id of a dataset without a plan: its campaign_id, or "run-" + the
// first 16 hex digits of sha256(run_id).
func CampaignIDFor(ds *schemas.Dataset) string {
	if ds.CampaignID != "" {
		return ds.CampaignID
	}
	return "run-" + schemas.SHA256Hex([]byte(ds.RunID))[:16]
}

// planOf is the implicit plan of a dataset published without one: exactly its cells.
func planOf(ds *schemas.Dataset) *schemas.DatasetPlan {
	p := &schemas.DatasetPlan{SchemaVersion: schemas.DatasetSchemaVersion, CampaignID: CampaignIDFor(ds)}
	for _, c := range ds.Cells {
		p.Cells = append(p.Cells, schemas.PlanCell{Identity: c.Identity, ExpectedRows: max(1, len(c.Rows))})
	}
	return p
}

// PublishDataset validates ds and, if it passes (or AllowPartial is set), seals its cells and records
// them in the campaign record of the plan.
//
// Order: validate everything (nothing is written when a rejection is found and AllowPartial is not
// set); freeze the plan (Create of the campaign record, or reuse of the same plan's record); read what
// every campaign record names sealed and refuse a cell one names sealed by another run while the
// bucket has lost it (lost.go); seal each other passed cell with Create; record every cell's state
// with Update on the campaign's revision. Errors:
// schemas.ValidationErrors (nothing written), *conflictsError (some cells sealed first by another
// attempt; theirs are untouched), *partialError (AllowPartial and some planned cells missing).
func (s *Sealer) PublishDataset(ctx context.Context, ds *schemas.Dataset, o PublishOptions) (*report, error) {
	rep := &report{RunID: ds.RunID}
	errs := ds.Validate()
	plan := o.Plan
	if plan == nil {
		plan = planOf(ds)
	} else {
		planned := map[string]bool{}
		for _, pc := range plan.Cells {
			planned[pc.Identity.Key()] = true
		}
		for i, c := range ds.Cells {
			if !planned[c.Key] {
				errs = append(errs, &schemas.DatasetError{Rule: schemas.RuleIdentity, Cell: ds.CellLabel(i), Row: -1,
					Detail: fmt.Sprintf("cell is not in the plan of campaign %s", plan.CampaignID)})
			}
		}
	}
	rep.CampaignID = plan.CampaignID
	rep.Rejections = errs
	if !campaignIDRe.MatchString(plan.CampaignID) {
		return rep, fmt.Errorf("seal: campaign id %q: want 1-200 of [-_=.a-zA-Z0-9]", plan.CampaignID)
	}
	datasetLevel := false
	for _, e := range errs {
		datasetLevel = datasetLevel || e.Cell == ""
	}
	if len(errs) > 0 && (!o.AllowPartial || datasetLevel) {
		return rep, errs
	}
	if !o.AllowPartial {
		have := map[string]bool{}
		for _, c := range ds.Cells {
			have[c.Key] = true
		}
		var absent []string
		for _, pc := range plan.Cells {
			if k := pc.Identity.Key(); !have[k] {
				absent = append(absent, k)
			}
		}
		if len(absent) > 0 {
			return rep, fmt.Errorf("%w: %d planned cell(s) of campaign %s absent from run %s (use --allow-partial): %s",
				errIncomplete, len(absent), plan.CampaignID, ds.RunID, strings.Join(absent, ", "))
		}
	}
	rejected := errs.ByCell()

	if _, err := freezePlan(ctx, s.history(), plan); err != nil {
		return rep, err
	}
	// What the campaign records say is sealed: a cell they name sealed by another run is not taken
	// while the bucket has lost it (lost.go).
	recorded, _, err := s.RecordedSeals(ctx)
	if err != nil {
		return rep, err
	}

	type job struct {
		i    int
		cell *schemas.Cell
	}
	var (
		mu        sync.Mutex
		conflicts []*conflictError
		failures  []error
		byKey     = map[string]cellReport{}
	)
	n := o.Concurrency
	if n < 1 {
		n = 8
	}
	toSeal, settled := 0, 0 // the cells sealed (those not rejected), and those settled so far
	for i := range ds.Cells {
		if len(rejected[ds.CellLabel(i)]) == 0 {
			toSeal++
		}
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				attemptID := newAttemptID()
				var out outcome
				refusal, err := s.guardMissing(ctx, j.cell, recorded[j.cell.Key], attemptID)
				switch {
				case refusal != nil:
					out, err = outcome{Key: j.cell.Key, Result: conflict}, refusal
				case err == nil:
					out, err = s.SealAttempt(ctx, j.cell, plan.CampaignID, attemptID)
				}
				cr := cellReport{Key: j.cell.Key, RunID: j.cell.Provenance.RunID, DatasetDigest: j.cell.Provenance.DatasetDigest,
					Identity: &j.cell.Identity, Revision: out.Revision, Source: s.source}
				var ce *conflictError
				mu.Lock()
				switch {
				case errors.As(err, &ce):
					cr.State = conflict.String()
					cr.Reason = ce.Error()
					conflicts = append(conflicts, ce)
				case err != nil:
					cr.State = stateMissing
					cr.Reason = err.Error()
					failures = append(failures, err)
				default:
					cr.State = out.Result.String()
					if out.Value != nil {
						cr.Source = out.Value.Source
					}
				}
				byKey[j.cell.Key] = cr
				settled++
				if o.Progress != nil {
					o.Progress(settled, toSeal)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range ds.Cells {
		if len(rejected[ds.CellLabel(i)]) > 0 {
			continue
		}
		jobs <- job{i, &ds.Cells[i]}
	}
	close(jobs)
	wg.Wait()

	// Every planned cell gets a state; rejected and absent ones are missing.
	record := map[string]schemas.CampaignCell{}
	var missing []string
	sealedCells := 0
	for i, c := range ds.Cells {
		if rs := rejected[ds.CellLabel(i)]; len(rs) > 0 {
			reasons := make([]string, len(rs))
			for k, r := range rs {
				reasons[k] = r.Error()
			}
			byKey[c.Key] = cellReport{Key: c.Key, State: stateRejected, RunID: c.Provenance.RunID,
				DatasetDigest: c.Provenance.DatasetDigest, Identity: &ds.Cells[i].Identity, Reason: strings.Join(reasons, "; ")}
		}
	}
	for _, pc := range plan.Cells {
		key := pc.Identity.Key()
		cr, ok := byKey[key]
		if !ok {
			id := pc.Identity
			cr = cellReport{Key: key, State: stateMissing, Identity: &id, Reason: "no cell for it in run " + ds.RunID}
			byKey[key] = cr
		}
		cc := schemas.CampaignCell{Key: key, RunID: cr.RunID, DatasetDigest: cr.DatasetDigest, Reason: cr.Reason}
		switch cr.State {
		case sealed.String(), alreadySealed.String():
			cc.State = schemas.CellSealed
			sealedCells++
		case conflict.String():
			cc.State = schemas.CellConflict
		default:
			cc.State = schemas.CellMissing
			missing = append(missing, key)
		}
		record[key] = cc
	}
	camp, err := recordCells(ctx, s.history(), plan.CampaignID, record)
	if err != nil {
		return rep, err
	}
	rep.Campaign = camp.State
	// What is missing is the campaign's view: a cell sealed by an earlier run of it is not missing.
	missing, sealedCells = nil, 0
	for _, cc := range camp.Cells {
		if cc.State == schemas.CellSealed {
			sealedCells++
		} else if cc.State == schemas.CellMissing || cc.State == schemas.CellPending {
			missing = append(missing, cc.Key)
		}
	}
	for _, cr := range byKey {
		rep.Cells = append(rep.Cells, cr)
	}
	sort.Slice(rep.Cells, func(i, j int) bool { return rep.Cells[i].Key < rep.Cells[j].Key })
	switch {
	case len(failures) > 0:
		return rep, fmt.Errorf("seal: %d cell(s) not settled: %w", len(failures), errors.Join(failures...))
	case len(conflicts) > 0:
		return rep, &conflictsError{Conflicts: conflicts}
	case len(missing) > 0:
		sort.Strings(missing)
		return rep, &partialError{CampaignID: plan.CampaignID, Sealed: sealedCells, Missing: missing}
	}
	return rep, nil
}
