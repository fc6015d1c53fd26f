package seal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Sealed cells that vanish.
//
// First writer wins rests on kv.Create failing for a key that holds a value. JetStream acknowledges a
// write before it is on disk unless the server syncs always (streams.SyncPolicy), and a damaged block
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
//     another run (or dataset) while the bucket does not hold it: a *ConflictError with Missing set,
//     naming the recorded seal and the refused attempt (errors.Is ErrConflict and ErrSealMissing).
//     The same run and dataset may seal it again, which restores it. The refusal stands as long as
//     the record names the old seal; an operator who decides the old seal is gone for good changes
//     the record (campaign cell state) first.

// ErrSealMissing: a campaign record names the cell sealed, and FPM_DATASETS does not hold it.
var ErrSealMissing = errors.New("seal: sealed cell missing from FPM_DATASETS")

// RecordedSeal is one cell a campaign record names sealed.
type RecordedSeal struct {
	Cell          string `json:"cell"`
	CampaignID    string `json:"campaign_id"`
	RunID         string `json:"run_id"`
	DatasetDigest string `json:"dataset_digest"`
}

// RecordedSeals reads every campaign record and returns, per cell key, the seals they name, and the
// keys of the records that do not decode (they name nothing the sealer can use).
func (s *Sealer) RecordedSeals(ctx context.Context) (map[string][]RecordedSeal, []string, error) {
	out := map[string][]RecordedSeal{}
	var corrupt []string
	err := s.campaigns(ctx, func(key string, value []byte) {
		var c schemas.Campaign
		if err := json.Unmarshal(value, &c); err != nil {
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
		return nil, nil, fmt.Errorf("seal: read campaign records: %w", err)
	}
	return out, corrupt, nil
}

// Reads that conclude "lost" from an absence go to the bucket stream's leader when the sealer has a
// JetStream context (WithJetStream; the consumer always gives it one): a direct get or a watch may be
// answered by a replica still catching up after a restart, which does not hold what the leader holds
// (streams.LastMsgFromLeader). Without one (a Sealer made from the bucket alone) they go through the
// bucket.

// campaigns passes every campaign record's key and value to f.
func (s *Sealer) campaigns(ctx context.Context, f func(key string, value []byte)) error {
	if s.js == nil {
		w, err := s.kv.WatchFiltered(ctx, []string{schemas.CampaignKeyPrefix + ">"}, jetstream.IgnoreDeletes())
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		for {
			select {
			case e := <-w.Updates():
				if e == nil {
					return nil
				}
				f(e.Key(), e.Value())
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	prefix := "$KV." + s.kv.Bucket() + "."
	var info *jetstream.StreamInfo
	err := s.untilAvailable(ctx, func(ctx context.Context) error {
		st, err := s.js.Stream(ctx, "KV_"+s.kv.Bucket())
		if err == nil {
			info, err = st.Info(ctx, jetstream.WithSubjectFilter(prefix+schemas.CampaignKeyPrefix+">"))
		}
		return err
	})
	if err != nil {
		return err
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		subjects = append(subjects, subj)
	}
	sort.Strings(subjects)
	for _, subj := range subjects {
		value, found, err := s.readLeader(ctx, subj)
		if err != nil {
			return err
		}
		if found {
			f(strings.TrimPrefix(subj, prefix), value)
		}
	}
	return nil
}

// readValue reads key's value; found is false when the bucket holds none (or a delete marker).
func (s *Sealer) readValue(ctx context.Context, key string) (value []byte, found bool, err error) {
	if s.js != nil {
		return s.readLeader(ctx, "$KV."+s.kv.Bucket()+"."+key)
	}
	octx, cancel := context.WithTimeout(ctx, s.opTimeout)
	defer cancel()
	e, err := s.kv.Get(octx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return e.Value(), true, nil
}

// readLeader reads the newest value on a KV subject from the bucket stream's leader.
func (s *Sealer) readLeader(ctx context.Context, subject string) ([]byte, bool, error) {
	var m *jetstream.RawStreamMsg
	err := s.untilAvailable(ctx, func(ctx context.Context) (err error) {
		m, err = streams.LastMsgFromLeader(ctx, s.js, "KV_"+s.kv.Bucket(), subject)
		return err
	})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, false, nil
	}
	return m.Data, true, nil
}

// untilAvailable runs f, each call within the sealer's operation timeout, again while the cluster
// cannot answer for the moment (streams.Unavailable): right after nodes restart, a leader is being
// elected exactly when an audit of what they still hold matters. It tries at most the sealer's
// retries, with its backoff.
func (s *Sealer) untilAvailable(ctx context.Context, f func(context.Context) error) error {
	pause := s.backoff
	var err error
	for try := 0; try < s.retries; try++ {
		octx, cancel := context.WithTimeout(ctx, s.opTimeout)
		err = f(octx)
		cancel()
		if err == nil || !streams.Unavailable(err) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, &pause)
	}
	return err
}

// AuditFinding is a recorded seal the bucket does not hold as recorded.
type AuditFinding struct {
	RecordedSeal
	// Missing: the bucket holds no value for the cell, or one that does not decode (Reason says which).
	// Otherwise the cell is held by another run: Found names it.
	Missing bool   `json:"missing"`
	Reason  string `json:"reason"`
	Found   *Attempt
}

// AuditReport is the outcome of Audit.
type AuditReport struct {
	// Checked counts the recorded seals checked (one per campaign naming a cell).
	Checked  int
	Findings []AuditFinding
	// CorruptCampaigns are the campaign records that do not decode: the seals they name are unknown.
	CorruptCampaigns []string
}

// Missing counts the findings whose cell is missing.
func (r *AuditReport) Missing() int {
	n := 0
	for _, f := range r.Findings {
		if f.Missing {
			n++
		}
	}
	return n
}

// Audit checks every seal the campaign records name against the bucket.
func (s *Sealer) Audit(ctx context.Context) (*AuditReport, error) {
	recorded, corrupt, err := s.RecordedSeals(ctx)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(recorded))
	for k := range recorded {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rep := &AuditReport{CorruptCampaigns: corrupt}
	for _, key := range keys {
		value, found, err := s.readValue(ctx, key)
		var v schemas.SealedCell
		reason := ""
		switch {
		case err != nil:
			return nil, fmt.Errorf("seal: audit %s: %w", key, err)
		case !found:
			reason = "no value in " + s.kv.Bucket()
		default:
			if err := json.Unmarshal(value, &v); err != nil {
				reason = "the value does not decode: " + err.Error()
			}
		}
		for _, rs := range recorded[key] {
			rep.Checked++
			switch {
			case reason != "":
				rep.Findings = append(rep.Findings, AuditFinding{RecordedSeal: rs, Missing: true, Reason: reason})
			case v.Provenance.RunID != rs.RunID || v.Provenance.DatasetDigest != rs.DatasetDigest:
				rep.Findings = append(rep.Findings, AuditFinding{RecordedSeal: rs, Reason: "held by another run",
					Found: &Attempt{RunID: v.Provenance.RunID, DatasetDigest: v.Provenance.DatasetDigest, AttemptID: v.AttemptID, Source: v.Source}})
			}
		}
	}
	return rep, nil
}

// guardMissing returns the refusal of c when a campaign record names c's cell sealed by another run
// or dataset and the bucket does not hold it; nil otherwise (Create then decides, as always).
func (s *Sealer) guardMissing(ctx context.Context, c *schemas.Cell, recorded []RecordedSeal, attemptID string) (*ConflictError, error) {
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
	_, found, err := s.readValue(ctx, c.Key)
	switch {
	case err != nil:
		return nil, fmt.Errorf("seal: read %s: %w", c.Key, err)
	case found:
		return nil, nil // held: Create refuses a different attempt with the value itself
	}
	return &ConflictError{Key: c.Key, Missing: true, CampaignID: other.CampaignID,
		Sealed:  Attempt{RunID: other.RunID, DatasetDigest: other.DatasetDigest, Source: "campaign " + other.CampaignID},
		Refused: Attempt{RunID: c.Provenance.RunID, DatasetDigest: c.Provenance.DatasetDigest, AttemptID: attemptID, Source: s.source}}, nil
}
