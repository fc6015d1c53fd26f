package streams

import (
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Dataset events: what the sealer finds wrong with FPM_DATASETS, on FPM_EVENTS.
//
// The campaign records in FPM_DATASETS name every sealed cell (run and dataset digest). A cell they
// name that the bucket no longer holds (a power cut before the server's fsync, a damaged block file, a
// deletion) is reported as cell_missing; a cell held by another run than the one they name as
// cell_replaced; a seal of such a missing cell by a different run, which the sealer refuses while the
// record stands, as seal_refused naming both runs. A revision no fpmbus writer stores (the bucket keeps
// every revision: an overwrite or delete marker after a sealed cell's value, a campaign revision that
// does not follow its record) is reported as cell_tampered or campaign_tampered; readers ignore it.

// datasetEventRoot is the root of DatasetEventSubject.
const datasetEventRoot = eventsRoot + ".dataset"

// DatasetEventWildcard matches every dataset event.
const DatasetEventWildcard = datasetEventRoot + ".>"

// DatasetEventSchema names the JSON format of DatasetEvent.
const DatasetEventSchema = "fpmbus.dataset.v1"

// Dataset event types (the "type" field and the Fpm-Event header).
const (
	DatasetCellMissing  = "cell_missing"
	DatasetCellReplaced = "cell_replaced"
	DatasetSealRefused  = "seal_refused"
	DatasetCellTampered = "cell_tampered"
	// DatasetCampaignTampered: a campaign revision that does not follow its record.
	DatasetCampaignTampered = "campaign_tampered"
)

// DatasetEventSubject carries the dataset events of campaign campaignID (the campaign whose record
// names the sealed cell).
func DatasetEventSubject(campaignID string) string {
	return datasetEventRoot + "." + EncodeToken(campaignID)
}

// DatasetEvent is one dataset event (JSON) on DatasetEventSubject(CampaignID).
type DatasetEvent struct {
	Schema string `json:"schema"` // DatasetEventSchema
	Type   string `json:"type"`   // DatasetCellMissing, DatasetCellReplaced or DatasetSealRefused
	ID     string `json:"id"`     // DatasetEventMsgID
	// Cell is the cell's key in FPM_DATASETS; CampaignID the campaign whose record names it sealed by
	// SealedRunID with SealedDatasetDigest.
	Cell                string `json:"cell"`
	CampaignID          string `json:"campaign_id"`
	SealedRunID         string `json:"sealed_run_id"`
	SealedDatasetDigest string `json:"sealed_dataset_digest"`
	// Found is what the bucket holds instead (cell_replaced), Refused what was refused (seal_refused):
	// run, dataset digest, attempt and source.
	FoundRunID           string `json:"found_run_id,omitempty"`
	FoundDatasetDigest   string `json:"found_dataset_digest,omitempty"`
	RefusedRunID         string `json:"refused_run_id,omitempty"`
	RefusedDatasetDigest string `json:"refused_dataset_digest,omitempty"`
	RefusedAttemptID     string `json:"refused_attempt_id,omitempty"`
	RefusedSource        string `json:"refused_source,omitempty"`
	// TamperedRevision and TamperedOp are the revision (KV revision = stream sequence) of a tampered
	// key and its operation (PUT, DEL, PURGE): cell_tampered, campaign_tampered (Cell is the key).
	TamperedRevision uint64 `json:"tampered_revision,omitempty"`
	TamperedOp       string `json:"tampered_op,omitempty"`
	// DetectedBy names the sealer instance; DetectedAtMs is when (Unix ms).
	DetectedBy   string `json:"detected_by"`
	DetectedAtMs int64  `json:"detected_at_ms"`
	Summary      string `json:"summary"`
}

// DatasetEventMsgID is the Nats-Msg-Id of a dataset event: the same finding by two sealers, or twice
// within the duplicate window, is stored once. refusedRunID is empty except for seal_refused.
func DatasetEventMsgID(typ, cell, campaignID, sealedRunID, refusedRunID string) string {
	id := "dataset:" + typ + ":" + cell + ":" + EncodeToken(campaignID) + ":" + EncodeToken(sealedRunID)
	if refusedRunID != "" {
		id += ":" + EncodeToken(refusedRunID)
	}
	return id
}

// DatasetTamperMsgID is the Nats-Msg-Id of a cell_tampered or campaign_tampered event: one per
// tampered revision of a key.
func DatasetTamperMsgID(typ, key string, revision uint64) string {
	return "dataset:" + typ + ":" + key + ":" + strconv.FormatUint(revision, 10)
}

// Msg is the event's message: subject DatasetEventSubject(e.CampaignID), JSON body, Nats-Msg-Id e.ID
// and Fpm-Event e.Type.
func (e *DatasetEvent) Msg() *nats.Msg {
	body, _ := json.Marshal(e) // plain strings and integers: cannot fail
	h := make(nats.Header, 2)
	h.Set(HeaderMsgID, e.ID)
	h.Set(HeaderEventType, e.Type)
	return &nats.Msg{Subject: DatasetEventSubject(e.CampaignID), Header: h, Data: body}
}
