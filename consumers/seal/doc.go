// Package seal is fpmbus's dataset sealer (the modelling proposal's dataset lifecycle: validate, seal,
// first writer wins, coverage): validated FPM cells are published to the JetStream KV bucket
// FPM_DATASETS, where the first writer wins.
//
// # Keys and values
//
//	cell.<sha256 of the canonical cell identity>   schemas.SealedCell, written once on a key that holds no
//	                                              seal; the sealed value is the key's first revision that
//	                                              is a seal (schemas.sealedValue)
//	campaign.<id>                                 schemas.Campaign (the frozen plan and each cell's state),
//	                                              frozen the same way, then only with Update on the key's
//	                                              last revision; read as its legitimate revisions
//
// The identity (schemas.CellIdentity) is the exact model, hardware, backend and version, quantization,
// KV dtype, parallelism, backend selections, collection-profile name and version, schema version and a
// settings digest: sha256 of the canonical JSON of the merged artefact's engine block (members that only
// record resolution on one rank removed, as the merger's identity check drops them), its
// benchmark_config and the whole collection profile. Any change of backend, profile or schema version
// is a new key, so old cells stay inspectable but never satisfy new coverage.
//
// # First writer wins, without a lock
//
// Sealer.Seal writes with "expected last subject sequence 0" (kv.Update at revision 0, not kv.Create,
// which would also write over a delete marker stored after a seal). It wins or loses atomically on the
// stream's last-subject-sequence check.
// A loss (errors.Is(err, jetstream.ErrKeyExists)) reads the key's history: the same attempt (run id and
// dataset digest) is an idempotent success (alreadySealed), anything else a *conflictError naming both
// the sealed and the refused attempt; the sealed value is never touched. A key whose revisions are none
// a seal (a delete marker or junk a leaked or buggy credential stored before anyone sealed it) is not
// sealed: the seal is written again, on that key's last revision, and is the cell. Any other error
// (timeout, leader change, no responders) leaves the outcome unknown: the key is read back, and the
// unique attempt id stored in the value says whether the lost-ack write was ours (sealed, Settled) or
// someone else's; if the key holds no seal the write is retried. The campaign record is changed only by updateCampaignKV: read, apply,
// Update(expected revision), re-read and re-apply on a revision conflict.
//
// # Sealed history that nothing rewrites
//
// The bucket is protected (streams.DatasetsBucket: no message delete, no purge, no rollup, discard
// new per key; created so, or protected at start and by `fpmbus streams apply`, keeping what it
// holds), so every revision stays. A credential that may write the bucket, the sealer's own included,
// can still store an overwrite or a delete marker as a later revision, or junk before the seal: every
// reader (this package's get, Read, list, the sealer itself, predict's catalog, `fpmbus datasets`)
// folds a key's history with schemas.KeyHistory, which takes a cell's first revision that is a seal as
// its sealed value and a campaign record as its first frozen plan and the revisions that legitimately
// follow it (nextCampaign in schemas), and the audit at start reports every other revision (revisions.go,
// lost.go: a cell_tampered or campaign_tampered event, gauges fpmbus_seal_tampered_cells and
// fpmbus_seal_tampered_campaigns, an error log). Only the removal of the whole bucket loses sealed
// cells.
//
// # Sealed cells that vanish
//
// Create wins only while the key holds a value. A cell the server loses (acknowledged before its
// fsync, or cut from a damaged block file on restart) would take any later Create, so a different run
// could win a cell already sealed. The campaign records name every sealed cell (run and dataset
// digest) and are the sealer's memory of them (lost.go): the consumer audits them at start and reports
// each cell the bucket has lost or holds under another run (log; gauges
// fpmbus_seal_sealed_cells_missing and fpmbus_seal_sealed_cells_replaced; a cell_missing or
// cell_replaced event on fpmevents.dataset.<campaign>, streams.DatasetEvent); PublishDataset refuses a
// different run's seal of a cell a record names while the bucket has lost it (*conflictError with
// Missing, errors.Is ErrSealMissing, naming both runs; the consumer adds a seal_refused event and
// fpmbus_seal_missing_cell_refusals_total). The run and dataset the record names may seal it again,
// which restores it; no other run ever can while the record stands, and the record's seals cannot be
// rewritten.
//
// # Publication
//
// PublishDataset validates everything first (schemas.Dataset.Validate: every rule, every cell; nothing
// is written on a rejection), freezes the plan, seals the passing cells and records every planned cell's
// state. By default every frozen cell must be present (errIncomplete). With AllowPartial the passing
// cells are sealed, every missing cell is recorded with its reason, the campaign stays partial and the
// command exits exitPartial (3); a conflict exits exitConflict (4).
//
// The durable Consumer (`fpmbus seal`) reads merged artefacts from fpmbench.merged.<run> (bodies
// inline or in FPM_BENCH_OBJECTS, via benchstore.BenchStore), takes the run's collection profile from the
// last message on fpmbench.profile.<run> (published by `fpmbus bench publish --profile FILE`; see
// benchstore.PublishProfile), builds the cell with FromMerged and publishes it. It is a durable.Consumer
// in a consumers/partition group keyed by the run (Config.Group): one instance at a time
// handles a run's merged artefact, and a takeover redelivers what was not done. Its only state is the
// bucket, whose compare-and-set keeps every cell sealed once whoever seals it. A merged artefact whose
// profile has not arrived, or whose seal outcome is unknown, is held and checked again on the runner's
// tick (never handed back to the server); one that can never be sealed is rejected: one dead letter on
// fpmevents.deadletter.consumer.seal, never delivered again. Subjects, headers and the object store are streams'
// (the wire contract); the sealer imports no other stage.
//
// # Watching
//
// `nats kv watch FPM_DATASETS` shows each seal (and campaign update) as it happens;
// `nats kv watch FPM_DATASETS 'cell.>'` only the seals. `fpmbus datasets ls|get|history` and
// `fpmbus datasets coverage --plan FILE` show source, dataset digest, cell identity and state.
package seal
