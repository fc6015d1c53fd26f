package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The KV bucket FPM_DATASETS (stream KV_FPM_DATASETS): sealed dataset cells and campaign records.
//
// A sealed cell must outlive every service credential that can write the bucket: the sealer's own
// (which must publish on $KV.FPM_DATASETS.> to seal) included. No subject permission can tell a seal
// from an overwrite, a delete marker or a purge (all are publishes on the key's subject), so the
// bucket's stream itself keeps every revision of every key:
//
//   - deny_delete: no message is removed by $JS.API.STREAM.MSG.DELETE (nats.go creates KV buckets so);
//   - deny_purge: no $JS.API.STREAM.PURGE, and so (the server requires it) allow_rollup_hdrs off: a
//     `nats kv purge` (a delete marker with Nats-Rollup: sub, which would remove every earlier
//     revision) is refused with "rollup not permitted";
//   - discard new per subject, max_msgs_per_subject DatasetsMaxRevisions: a key that has that many
//     revisions refuses the next write instead of dropping its oldest, so no flood of writes pushes
//     the first revision out; discard new for the stream as a whole, so a full bucket refuses writes
//     instead of removing old ones;
//   - max_age unlimited: no revision expires.
//
// deny_delete and deny_purge cannot be cleared once set (the server refuses the update), so only the
// removal of the whole bucket ($JS.API.STREAM.DELETE.KV_FPM_DATASETS, the operator's alone in
// ops/nats/permissions.conf) loses a sealed cell. Overwrites and delete markers still get stored,
// as later revisions: the readers of sealed cells take a cell's first revision as its sealed value
// and the sealer's audit reports every later one as tampering (consumers/seal).
//
// Every change the protection makes to an existing bucket keeps what it holds (no limit is lowered),
// so it is applied by `fpmbus streams apply` and, where the credential allows it, by the sealer at
// start (ProtectDatasets); a bucket that is missing is created protected (DatasetsBucket).

// DatasetsStream is the stream of KV bucket FPM_DATASETS.
const DatasetsStream = "KV_" + BucketDatasets

// DatasetsMaxRevisions is the most revisions one key of FPM_DATASETS holds; a write beyond it is
// refused. A sealed cell has one; a campaign record one per publication that changes it.
const DatasetsMaxRevisions = 1 << 16

// datasetsDuplicates is the duplicate window nats.go gives a KV bucket without a TTL.
const datasetsDuplicates = 2 * time.Minute

// errUnprotected: FPM_DATASETS lacks a protection and this credential could not add it.
var errUnprotected = errors.New("streams: FPM_DATASETS is not protected against rewriting sealed history")

// DatasetsBucket is the definition of FPM_DATASETS's stream: a KV bucket as nats.go creates one (its
// subjects, direct gets, discard new), protected, with c's storage and replicas.
func (c Config) DatasetsBucket() jetstream.StreamConfig {
	return protect(jetstream.StreamConfig{
		Name:         DatasetsStream,
		Description:  "fpmbus sealed FPM dataset cells (first writer wins, every revision kept) and campaign records",
		Subjects:     []string{"$KV." + BucketDatasets + ".>"},
		Retention:    jetstream.LimitsPolicy,
		MaxConsumers: -1,
		MaxMsgs:      -1,
		MaxBytes:     -1,
		MaxMsgSize:   -1,
		Storage:      c.Storage,
		Replicas:     c.Replicas,
		Duplicates:   datasetsDuplicates,
		AllowDirect:  true,
	})
}

// protect returns sc with the protection of FPM_DATASETS: every setting it changes keeps what the
// stream holds (a per-key limit is only ever raised).
func protect(sc jetstream.StreamConfig) jetstream.StreamConfig {
	sc.DenyDelete, sc.DenyPurge, sc.AllowRollup = true, true, false
	sc.Discard, sc.DiscardNewPerSubject = jetstream.DiscardNew, true
	sc.MaxMsgsPerSubject = max(sc.MaxMsgsPerSubject, DatasetsMaxRevisions)
	sc.MaxAge = 0
	// Limit markers need rollups (the server would turn deny_purge off again to allow them).
	sc.SubjectDeleteMarkerTTL = 0
	return sc
}

// datasetsProtection lists what current (FPM_DATASETS's stream as the server has it) lacks of the
// protection, as changes none of which is destructive; empty when it is protected.
func datasetsProtection(current jetstream.StreamConfig) []Change {
	want := protect(current)
	var out []Change
	add := func(setting, cur, w string) {
		if cur != w {
			out = append(out, Change{Stream: current.Name, Setting: setting, Current: cur, Wanted: w})
		}
	}
	add("deny_delete", fmt.Sprint(current.DenyDelete), fmt.Sprint(want.DenyDelete))
	add("deny_purge", fmt.Sprint(current.DenyPurge), fmt.Sprint(want.DenyPurge))
	add("allow_rollup_hdrs", fmt.Sprint(current.AllowRollup), fmt.Sprint(want.AllowRollup))
	add("discard", enumName(current.Discard), enumName(want.Discard))
	add("discard_new_per_subject", fmt.Sprint(current.DiscardNewPerSubject), fmt.Sprint(want.DiscardNewPerSubject))
	add("max_msgs_per_subject", fmt.Sprint(current.MaxMsgsPerSubject), fmt.Sprint(want.MaxMsgsPerSubject))
	add("max_age", formatAge(unlimited(int64(current.MaxAge))), formatAge(unlimited(int64(want.MaxAge))))
	return out
}

// ProtectedDatasets reports whether FPM_DATASETS's stream config sc has every protection.
func ProtectedDatasets(sc jetstream.StreamConfig) bool { return len(datasetsProtection(sc)) == 0 }

// AddDatasets adds FPM_DATASETS to the plan: created protected when it is missing, protected when it
// lacks some of it (every such change keeps what it holds), left as it is otherwise. Its other
// settings (replicas, storage, description) are the bucket's own and never changed.
func (p *plan) AddDatasets(ctx context.Context, js jetstream.JetStream, c Config) error {
	s, err := js.Stream(ctx, DatasetsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		p.Steps = append(p.Steps, step{Stream: DatasetsStream, Create: true, send: c.DatasetsBucket()})
		return nil
	case err != nil:
		return fmt.Errorf("streams: plan %s: %w", DatasetsStream, err)
	}
	current := s.CachedInfo().Config
	p.Steps = append(p.Steps, step{Stream: DatasetsStream, Changes: datasetsProtection(current), send: protect(current)})
	return nil
}

// EnsureDatasets opens FPM_DATASETS, creating it protected (DatasetsBucket) when it does not exist;
// an existing bucket is used as it is. It does not protect an existing bucket: ProtectDatasets does.
func EnsureDatasets(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, BucketDatasets)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = placed(ctx, "key-value bucket "+BucketDatasets, c.Replicas, func(ctx context.Context) (jetstream.Stream, error) {
			return js.CreateStream(ctx, c.DatasetsBucket())
		})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another component created it meanwhile
			return nil, fmt.Errorf("streams: key-value bucket %s: %w", BucketDatasets, err)
		}
		kv, err = js.KeyValue(ctx, BucketDatasets)
	}
	if err != nil {
		return nil, fmt.Errorf("streams: key-value bucket %s: %w", BucketDatasets, err)
	}
	return kv, nil
}

// ProtectDatasets adds to an existing FPM_DATASETS the protection it lacks (see datasetsProtection)
// and returns the changes it made. A credential that may not update the stream (every service user of
// ops/nats/permissions.conf: only the operator may) gets, within timeout, an errUnprotected error
// naming what is missing and the command that adds it; the bucket is used as it is meanwhile.
func ProtectDatasets(ctx context.Context, js jetstream.JetStream, timeout time.Duration, log *slog.Logger) ([]Change, error) {
	if log == nil {
		log = slog.Default()
	}
	s, err := js.Stream(ctx, DatasetsStream)
	if err != nil {
		return nil, fmt.Errorf("streams: %s: %w", DatasetsStream, err)
	}
	current := s.CachedInfo().Config
	changes := datasetsProtection(current)
	if len(changes) == 0 {
		return nil, nil
	}
	names := make([]string, len(changes))
	for i, ch := range changes {
		names[i] = ch.String()
	}
	uctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := js.UpdateStream(uctx, protect(current)); err != nil {
		return nil, fmt.Errorf("%w: %s (could not change it: %v); run `fpmbus streams apply` as the operator, which keeps every cell",
			errUnprotected, strings.Join(names, "; "), err)
	}
	log.Info("FPM_DATASETS protected: every revision of its keys is kept (no delete, purge or rollup)", "changes", names)
	return changes, nil
}
