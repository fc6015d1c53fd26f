package predict

import (
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Source names what every answer is computed from: cells sealed by fpmbus in FPM_DATASETS.
const Source = "fpmbus-cells"

// Answer statuses.
const (
	// StatusMeasured: the query's coordinates are a measured row; its latency is returned unchanged.
	StatusMeasured = "measured"
	// StatusInterpolated: the coordinates lie between measured rows of one surface.
	StatusInterpolated = "interpolated"
	// StatusComposed: a mixed step, composed from a prefill part and a decode marginal; the parts say
	// whether each was measured or interpolated. No cell ever measures a mixed step.
	StatusComposed = "composed"
	// StatusRefused: no number; Refusal says why.
	StatusRefused = "refused"
)

// Answer is the estimator's reply to one Query.
type Answer struct {
	// Query is the query answered, echoed (with an inferred phase filled in).
	Query  Query  `json:"query"`
	Status string `json:"status"`
	// LatencyMS is the predicted wall time of the forward pass in milliseconds; absent when refused.
	LatencyMS *float64 `json:"latency_ms,omitempty"`
	Source    string   `json:"source"`
	Bucket    string   `json:"bucket"`
	// Cell is the sealed cell the answer comes from (also on refusals that concern a known cell).
	Cell *cellRef `json:"cell,omitempty"`
	// Parts are the surface evaluations: one for a prefill or decode step; prefill, decode and
	// decode_baseline for a mixed step.
	Parts       []part       `json:"parts,omitempty"`
	Composition *composition `json:"composition,omitempty"`
	Refusal     *refusal     `json:"refusal,omitempty"`
}

// Refused reports whether the answer carries no number.
func (a *Answer) Refused() bool { return a.Status == StatusRefused }

// cellRef identifies the sealed cell an answer comes from.
type cellRef struct {
	Key           string                `json:"key"`
	Revision      uint64                `json:"revision"`
	DatasetDigest string                `json:"dataset_digest,omitempty"`
	RunID         string                `json:"run_id,omitempty"`
	CampaignID    string                `json:"campaign_id,omitempty"`
	SealedBy      string                `json:"sealed_by,omitempty"`
	Identity      *schemas.CellIdentity `json:"identity,omitempty"`
}

// Part roles.
const (
	rolePrefill        = "prefill"
	roleDecode         = "decode"
	roleDecodeBaseline = "decode_baseline"
)

// part is one evaluation of one surface of the cell.
type part struct {
	Role    string `json:"role"`
	Surface string `json:"surface"`
	// Status is measured or interpolated.
	Status    string  `json:"status"`
	LatencyMS float64 `json:"latency_ms"`
	// At is where the surface was evaluated, in FPM coordinates (a decode baseline between measured
	// batch sizes may sit at a fractional KV sum).
	At map[string]float64 `json:"at"`
	// Points are the measured rows used, with their weights (one point, weight 1, when measured).
	Points []point `json:"points"`
}

// point is one measured row and its weight in a Part; the weights of a Part sum to 1.
type point struct {
	schemas.Row
	Weight float64 `json:"weight"`
}

// formulaMixed is how a mixed step is composed (composition.Formula).
const formulaMixed = "prefill + max(0, decode - decode_baseline)"

// composition shows how a mixed step's latency was composed from its parts.
type composition struct {
	Formula          string  `json:"formula"`
	PrefillMS        float64 `json:"prefill_ms"`
	DecodeMS         float64 `json:"decode_ms"`
	DecodeBaselineMS float64 `json:"decode_baseline_ms"`
	// DecodeMarginalMS is max(0, DecodeMS − DecodeBaselineMS).
	DecodeMarginalMS float64 `json:"decode_marginal_ms"`
	// Clamped: the decode latency was below its baseline (measurement noise on a flat surface) and the
	// marginal was raised to 0.
	Clamped bool `json:"clamped"`
}

// Reason is why a query was refused.
type Reason string

// Refusal reasons.
const (
	// ReasonInvalidQuery: the query is malformed (bad JSON, no deployment, impossible coordinates).
	ReasonInvalidQuery Reason = "invalid_query"
	// reasonUnsupportedFeature: the step uses something the surfaces do not measure.
	reasonUnsupportedFeature Reason = "unsupported_feature"
	// reasonWrongIdentity: the identity is not a valid cell identity, or the key given with it is not
	// its key.
	reasonWrongIdentity Reason = "wrong_identity"
	// ReasonUnknownIdentity: nothing is sealed under the identity's key; Closest lists the sealed
	// identities that differ in the fewest fields.
	ReasonUnknownIdentity Reason = "unknown_identity"
	// reasonCorruptCell: the sealed value fails validation (its digest, its key, its rows); Rules
	// names the rules.
	reasonCorruptCell Reason = "corrupt_cell"
	// ReasonIncompleteCampaign: require_complete and the cell's campaign is not complete.
	ReasonIncompleteCampaign Reason = "incomplete_campaign"
	// ReasonOutOfDomain: a coordinate lies outside the measured grid; Domain says which and where.
	ReasonOutOfDomain Reason = "out_of_domain"
)

// Reasons lists every refusal reason.
var Reasons = []Reason{ReasonInvalidQuery, reasonUnsupportedFeature, reasonWrongIdentity, ReasonUnknownIdentity,
	reasonCorruptCell, ReasonIncompleteCampaign, ReasonOutOfDomain}

// refusal is a structured reason for not answering.
type refusal struct {
	Reason   Reason           `json:"reason"`
	Detail   string           `json:"detail"`
	Domain   *domainViolation `json:"domain,omitempty"`
	Closest  []identityMatch  `json:"closest,omitempty"`
	Rules    []string         `json:"rules,omitempty"`
	Features []string         `json:"features,omitempty"`
	Campaign *campaignState   `json:"campaign,omitempty"`
}

// Domain bounds.
const (
	boundLower  = "lower"
	boundUpper  = "upper"
	boundAbsent = "absent" // the cell has no rows of the surface at all
)

// domainViolation names the coordinate a query puts outside the measured grid.
type domainViolation struct {
	// Role is the part being evaluated (prefill, decode, decode_baseline).
	Role       string `json:"role"`
	Surface    string `json:"surface"`
	Coordinate string `json:"coordinate"`
	// Value is the query's value of the coordinate; Limit the bound it crosses, both in the query's
	// terms (token sums at the query's number of requests).
	Value float64 `json:"value"`
	Bound string  `json:"bound"`
	Limit float64 `json:"limit"`
	// perRequest is set for token coordinates, which the grid spans per request (sum / requests):
	// the same value and limit divided by the number of requests.
	PerRequest *perRequest `json:"per_request,omitempty"`
	// Slice is the measured grid slice whose bound was crossed (its outer coordinates), empty for the
	// outermost coordinate.
	Slice map[string]float64 `json:"slice,omitempty"`
}

// perRequest is a token coordinate divided by the number of requests.
type perRequest struct {
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
}

// identityMatch is a sealed identity close to an unknown one, with the fields in which they differ.
type identityMatch struct {
	Key     string      `json:"key"`
	Differs []fieldDiff `json:"differs"`
}

// fieldDiff is one identity field that differs: the query's value and the sealed one ("" = absent).
type fieldDiff struct {
	Field  string `json:"field"`
	Query  string `json:"query"`
	Sealed string `json:"sealed"`
}

// campaignState is the state of a cell's campaign, on an incomplete_campaign refusal.
type campaignState struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Revision uint64 `json:"revision,omitempty"`
	// Missing are the campaign's cells that are not sealed.
	Missing []string `json:"missing,omitempty"`
}

// InvalidQuery is the answer to input that is not a query at all (err from DecodeQuery): refused,
// invalid_query, nothing echoed. A nil err gives a refusal with a generic detail.
func InvalidQuery(err error) Answer {
	detail := "not a query"
	if err != nil {
		detail = err.Error()
	}
	return newAnswer(Query{}).refuse(invalid(detail))
}

func newAnswer(q Query) Answer {
	return Answer{Query: q, Source: Source, Bucket: streams.BucketDatasets}
}

func (a Answer) refuse(r *refusal) Answer {
	r.Detail = Bounded(r.Detail)
	a.Status, a.LatencyMS, a.Parts, a.Composition, a.Refusal = StatusRefused, nil, nil, nil, r
	return a
}
