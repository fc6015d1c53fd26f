package seal

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsconn"
	"github.com/fpmbus/fpmbus/schemas"
)

// Sealed cells that vanish.
//
// First writer wins rests on kv.Create failing for a key that holds a value. JetStream acknowledges a
// write before it is on disk unless the server syncs always (natsserver.SyncPolicy), and a damaged block
// file loses messages when the server starts, so a sealed cell can vanish; its key would then take
// any run's Create, and a later, different run would win a cell another run had sealed. The campaign
// records (campaign.<id>, written after the seals) name every sealed cell with its run and dataset
// digest, so they are the sealer's memory of what it sealed:
//
//   - Sealer.Audit re-reads every campaign record and checks every cell recorded sealed: one the bucket
//     does not hold (or cannot decode) is missing, one held by another run is replaced. The consumer
//     audits at start and reports each finding (log, gauge fpmbus_seal_sealed_cells_missing, an event
//     on fpmevents.dataset.<campaign>).
//   - PublishDataset reads the records before it seals and refuses a cell a record names sealed by
//     another run (or dataset) while the bucket does not hold it: a *conflictError with Missing set,
//     naming the recorded seal and the refused attempt (errors.Is ErrConflict and ErrSealMissing).
//     The same run and dataset may seal it again, which restores it. The refusal stands for good: a
//     campaign revision that drops a seal is tampering, ignored by every reader (revisions.go).

// ErrSealMissing: a campaign record names the cell sealed, and FPM_DATASETS does not hold it.
var ErrSealMissing = errors.New("seal: sealed cell missing from FPM_DATASETS")

// RecordedSeal is one cell a campaign record names sealed.
type RecordedSeal struct {
	Cell          string `json:"cell"`
	CampaignID    string `json:"campaign_id"`
	RunID         string `json:"run_id"`
	DatasetDigest string `json:"dataset_digest"`
}

// RecordedSeals reads every campaign record (its history folded: revisions.go) and returns, per cell
// key, the seals they name, and the campaign keys that hold no frozen plan (only revisions no fpmbus
// writer stores: they name nothing the sealer can use).
func (s *Sealer) RecordedSeals(ctx context.Context) (map[string][]RecordedSeal, []string, error) {
	out, corrupt, _, err := s.recordedSeals(ctx)
	return out, corrupt, err
}

// recordedSeals is RecordedSeals and the campaign revisions its fold ignored as tampering.
func (s *Sealer) recordedSeals(ctx context.Context) (map[string][]RecordedSeal, []string, []tampered, error) {
	out := map[string][]RecordedSeal{}
	var corrupt []string
	var tampered []tampered
	err := s.campaigns(ctx, func(key string, revs []revision) {
		e := foldAll(key, revs).entry()
		tampered = append(tampered, e.Ignored...)
		c := e.Campaign
		if c == nil {
			corrupt = append(corrupt, key)
			return
		}
		for _, cc := range c.Cells {
			if cc.State == schemas.CellSealed {
				out[cc.Key] = append(out[cc.Key], RecordedSeal{Cell: cc.Key, CampaignID: c.CampaignID, RunID: cc.RunID, DatasetDigest: cc.DatasetDigest})
			}
		}
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("seal: read campaign records: %w", err)
	}
	return out, corrupt, tampered, nil
}

// Reads that conclude "lost" from an absence go to the bucket stream's leader when the sealer has a
// JetStream context (withJetStream; the consumer always gives it one): a direct get or a watch may be
// answered by a replica still catching up after a restart, which does not hold what the leader holds
// (natsconn.LastMsgFromLeader). Without one (a Sealer made from the bucket alone) they go through the
// bucket.

// campaigns passes every campaign record's key and revisions to f, in key order.
func (s *Sealer) campaigns(ctx context.Context, f func(key string, revs []revision)) error {
	counts, err := s.revisionCounts(ctx, schemas.CampaignKeyPrefix)
	if err != nil {
		return err
	}
	h := s.history()
	for _, key := range sortedKeys(counts) {
		revs, err := h.all(ctx, key)
		if err != nil {
			return err
		}
		f(key, revs)
	}
	return nil
}

// revisionCounts returns, for every key under prefix that has a revision, how many it has: from the
// bucket stream's leader (the stream's per-subject counts), or through the bucket.
func (s *Sealer) revisionCounts(ctx context.Context, prefix string) (map[string]uint64, error) {
	out := map[string]uint64{}
	if s.js == nil {
		w, err := s.kv.WatchFiltered(ctx, []string{prefix + ">"}, jetstream.IncludeHistory())
		if err != nil {
			return nil, err
		}
		defer func() { _ = w.Stop() }()
		for {
			select {
			case e := <-w.Updates():
				if e == nil {
					return out, nil
				}
				out[e.Key()]++
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	subjPrefix := "$KV." + s.kv.Bucket() + "."
	var info *jetstream.StreamInfo
	err := s.untilAvailable(ctx, func(ctx context.Context) error {
		st, err := s.js.Stream(ctx, "KV_"+s.kv.Bucket())
		if err == nil {
			info, err = st.Info(ctx, jetstream.WithSubjectFilter(subjPrefix+prefix+">"))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for subj, n := range info.State.Subjects {
		out[strings.TrimPrefix(subj, subjPrefix)] = n
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// holdsSeal reports whether key holds a sealed value (a revision that is a seal, revisions.go): a key
// whose revisions are none a seal (it lost its seal, or only ever held junk) does not.
func (s *Sealer) holdsSeal(ctx context.Context, key string) (bool, error) {
	octx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	kh, err := s.history().sealed(octx, key)
	if err != nil {
		return false, err
	}
	return kh.Cell != nil, nil
}

// untilAvailable runs f, each call within the sealer's operation timeout, again while the cluster
// cannot answer for the moment (natsconn.Unavailable): right after nodes restart, a leader is being
// elected exactly when an audit of what they still hold matters. It tries at most the sealer's
// retries, with its backoff.
func (s *Sealer) untilAvailable(ctx context.Context, f func(context.Context) error) error {
	pauses := s.pauses()
	var err error
	for try := 0; try < s.retries; try++ {
		octx, cancel := context.WithTimeout(ctx, s.opTimeout)
		err = f(octx)
		cancel()
		if err == nil || !natsconn.Unavailable(err) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, pauses)
	}
	return err
}

// auditFinding is a recorded seal the bucket does not hold as recorded.
type auditFinding struct {
	RecordedSeal
	// Missing: the bucket holds no value for the cell, or no revision that is a seal (Reason says which).
	// Otherwise the cell is held by another run: Found names it.
	Missing bool   `json:"missing"`
	Reason  string `json:"reason"`
	Found   *attempt
}

// auditReport is the outcome of Audit.
type auditReport struct {
	// Checked counts the recorded seals checked (one per campaign naming a cell).
	Checked  int
	Findings []auditFinding
	// CorruptCampaigns are the campaign keys that hold no frozen plan, only revisions no fpmbus writer
	// stores: the seals they would name are unknown.
	CorruptCampaigns []string
	// Tampered are the revisions of cell keys that are no seal or follow the seal, and the campaign
	// revisions that are no frozen plan or do not follow their record, in key and revision order.
	Tampered []tampered
}

// TamperedKeys counts the distinct keys of r.Tampered with prefix (schemas.CellKeyPrefix or
// schemas.CampaignKeyPrefix).
func (r *auditReport) TamperedKeys(prefix string) int {
	seen := map[string]bool{}
	for _, t := range r.Tampered {
		if strings.HasPrefix(t.Key, prefix) {
			seen[t.Key] = true
		}
	}
	return len(seen)
}

// Missing counts the findings whose cell is missing.
func (r *auditReport) Missing() int {
	n := 0
	for _, f := range r.Findings {
		if f.Missing {
			n++
		}
	}
	return n
}

// Audit checks every seal the campaign records name against the bucket (the cell's sealed value), and
// reports every revision no fpmbus writer stores: one of a cell key that is no seal (a delete marker,
// junk) or follows its seal, a campaign revision that is no frozen plan or does not follow its record.
func (s *Sealer) Audit(ctx context.Context) (*auditReport, error) {
	recorded, corrupt, tampered, err := s.recordedSeals(ctx)
	if err != nil {
		return nil, err
	}
	keys := sortedKeys(recorded)
	rep := &auditReport{CorruptCampaigns: corrupt}
	cells, err := s.revisionCounts(ctx, schemas.CellKeyPrefix)
	if err != nil {
		return nil, fmt.Errorf("seal: audit: %w", err)
	}
	h := s.history()
	for _, key := range sortedKeys(cells) {
		// A key with one revision holds a seal or nothing yet; reading every sealed cell at each start
		// would cost a read per cell for nothing. A revision that is no seal is reported once another
		// revision (the seal that goes on top of it) follows.
		if cells[key] < 2 {
			continue
		}
		revs, err := h.all(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("seal: audit %s: %w", key, err)
		}
		rep.Tampered = append(rep.Tampered, foldAll(key, revs).entry().Ignored...)
	}
	rep.Tampered = append(rep.Tampered, tampered...)
	for _, key := range keys {
		kh, err := h.sealed(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("seal: audit %s: %w", key, err)
		}
		var v schemas.SealedCell
		reason := ""
		switch {
		case kh.Last == 0:
			reason = "no value in " + s.kv.Bucket()
		case kh.Cell == nil:
			reason = "no sealed value in " + s.kv.Bucket() + ": " + kh.NoRecord
		default:
			v = *kh.Cell
		}
		for _, rs := range recorded[key] {
			rep.Checked++
			switch {
			case reason != "":
				rep.Findings = append(rep.Findings, auditFinding{RecordedSeal: rs, Missing: true, Reason: reason})
			case v.Provenance.RunID != rs.RunID || v.Provenance.DatasetDigest != rs.DatasetDigest:
				rep.Findings = append(rep.Findings, auditFinding{RecordedSeal: rs, Reason: "held by another run",
					Found: &attempt{RunID: v.Provenance.RunID, DatasetDigest: v.Provenance.DatasetDigest, AttemptID: v.AttemptID, Source: v.Source}})
			}
		}
	}
	return rep, nil
}

// guardMissing returns the refusal of c when a campaign record names c's cell sealed by another run
// or dataset and the bucket does not hold it; nil otherwise (Create then decides, as always).
func (s *Sealer) guardMissing(ctx context.Context, c *schemas.Cell, recorded []RecordedSeal, attemptID string) (*conflictError, error) {
	var other *RecordedSeal
	for i, rs := range recorded {
		if rs.RunID != c.Provenance.RunID || rs.DatasetDigest != c.Provenance.DatasetDigest {
			other = &recorded[i]
			break
		}
	}
	if other == nil {
		return nil, nil
	}
	found, err := s.holdsSeal(ctx, c.Key)
	switch {
	case err != nil:
		return nil, fmt.Errorf("seal: read %s: %w", c.Key, err)
	case found:
		return nil, nil // held: Create refuses a different attempt with the value itself
	}
	return &conflictError{Key: c.Key, Missing: true, CampaignID: other.CampaignID,
		Sealed:  attempt{RunID: other.RunID, DatasetDigest: other.DatasetDigest, Source: "campaign " + other.CampaignID},
		Refused: attempt{RunID: c.Provenance.RunID, DatasetDigest: c.Provenance.DatasetDigest, AttemptID: attemptID, Source: s.source}}, nil
}
