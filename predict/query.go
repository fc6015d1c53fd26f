package predict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// Step phases. A cell measures pure prefill and pure decode forward passes; a mixed step carries both
// parts and is composed from the two surfaces.
const (
	PhasePrefill = schemas.PhasePrefill
	PhaseDecode  = schemas.PhaseDecode
	phaseMixed   = "mixed"
)

// Step is one forward pass in FPM coordinates (the scheduled_requests fields of a ForwardPassMetrics).
// A prefill step sets the three prefill coordinates, a decode step the two decode coordinates, a mixed
// step all five. Phase may be left empty: it is then inferred from which coordinates are set.
type Step struct {
	Phase              string `json:"phase,omitempty"`
	NumPrefillRequests int64  `json:"num_prefill_requests,omitempty"`
	SumPrefillTokens   int64  `json:"sum_prefill_tokens,omitempty"`
	SumPrefillKVTokens int64  `json:"sum_prefill_kv_tokens,omitempty"`
	NumDecodeRequests  int64  `json:"num_decode_requests,omitempty"`
	SumDecodeKVTokens  int64  `json:"sum_decode_kv_tokens,omitempty"`
}

// MarshalJSON writes the phase and every coordinate of the phase's parts, zeros included (a prefill
// step without cached KV shows "sum_prefill_kv_tokens": 0), and nothing of the other phase.
func (s Step) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"phase":%q`, s.Phase)
	if s.Phase != PhaseDecode {
		fmt.Fprintf(&b, `,"num_prefill_requests":%d,"sum_prefill_tokens":%d,"sum_prefill_kv_tokens":%d`,
			s.NumPrefillRequests, s.SumPrefillTokens, s.SumPrefillKVTokens)
	}
	if s.Phase != PhasePrefill {
		fmt.Fprintf(&b, `,"num_decode_requests":%d,"sum_decode_kv_tokens":%d`, s.NumDecodeRequests, s.SumDecodeKVTokens)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func (s Step) hasPrefill() bool {
	return s.NumPrefillRequests != 0 || s.SumPrefillTokens != 0 || s.SumPrefillKVTokens != 0
}

func (s Step) hasDecode() bool { return s.NumDecodeRequests != 0 || s.SumDecodeKVTokens != 0 }

// Query asks for the latency of one step of one deployment. The deployment is named by its identity
// (the fields and settings digest the sealer derives, schemas.CellIdentity) or by its cell key
// ("cell.<sha256>"); when both are given they must agree.
type Query struct {
	// ID is the caller's label for the query, echoed in the answer.
	ID       string                `json:"id,omitempty"`
	Key      string                `json:"key,omitempty"`
	Identity *schemas.CellIdentity `json:"identity,omitempty"`
	Step     Step                  `json:"step"`
	// Features names what the step uses beyond a plain forward pass (speculative decoding, LoRA
	// adapters, encoder inputs, KV transfer, ...). The pure-prefill and pure-decode surfaces measure
	// none of them, so any feature is refused as unsupported rather than approximated.
	Features []string `json:"features,omitempty"`
	// RequireComplete refuses cells whose campaign is not complete (every frozen cell sealed).
	RequireComplete bool `json:"require_complete,omitempty"`
}

// supportedFeatures is the set of step features the estimator models: none yet. Adding one needs its
// own collection profile or identity field, so that cells measure it.
var supportedFeatures = map[string]bool{}

// DecodeQuery parses one query strictly: unknown fields and trailing data are errors. The error's text
// is bounded (Bounded): the JSON decoder echoes what it refused, a number of any length included.
func DecodeQuery(b []byte) (Query, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var q Query
	if err := dec.Decode(&q); err != nil {
		return Query{}, boundedErr(fmt.Errorf("decode query: %w", err))
	}
	if dec.More() {
		return Query{}, fmt.Errorf("decode query: trailing data after the query object")
	}
	return q, nil
}

// normalize infers an empty phase, defaults the identity's schema version (as plans do), and returns
// the refusal of a query that cannot be asked: nil when it is well formed.
func (q *Query) normalize() *refusal {
	q.Phase()
	if q.Identity != nil && q.Identity.SchemaVersion == 0 {
		id := *q.Identity
		id.SchemaVersion = schemas.DatasetSchemaVersion
		q.Identity = &id
	}
	if q.Key == "" && q.Identity == nil {
		return invalid("the query names no deployment: give its identity or its cell key")
	}
	s := q.Step
	switch s.Phase {
	case "":
		return invalid("the step sets no coordinate")
	case PhasePrefill, PhaseDecode, phaseMixed:
	default:
		return &refusal{Reason: reasonUnsupportedFeature, Features: []string{"phase:" + s.Phase},
			Detail: fmt.Sprintf("phase %q: the estimator models prefill, decode and mixed steps", s.Phase)}
	}
	for name, v := range map[string]int64{"num_prefill_requests": s.NumPrefillRequests, "sum_prefill_tokens": s.SumPrefillTokens,
		"sum_prefill_kv_tokens": s.SumPrefillKVTokens, "num_decode_requests": s.NumDecodeRequests, "sum_decode_kv_tokens": s.SumDecodeKVTokens} {
		if v < 0 {
			return invalid(fmt.Sprintf("%s %d is negative", name, v))
		}
	}
	// Each phase the step has: its requests and tokens are coherent, and a step of that phase alone
	// carries none of the other's coordinates.
	for _, ph := range []struct {
		phase, other           string
		hasOther               bool
		num, sum               int64
		numName, sumName, each string
	}{
		{PhasePrefill, PhaseDecode, s.hasDecode(), s.NumPrefillRequests, s.SumPrefillTokens,
			"num_prefill_requests", "sum_prefill_tokens", "computes at least one token"},
		{PhaseDecode, PhasePrefill, s.hasPrefill(), s.NumDecodeRequests, s.SumDecodeKVTokens,
			"num_decode_requests", "sum_decode_kv_tokens", "reads at least one KV token"},
	} {
		if s.Phase == ph.other {
			continue
		}
		switch {
		case s.Phase == ph.phase && ph.hasOther:
			return invalid(fmt.Sprintf("a %s step carries %s coordinates (a step with both is mixed)", ph.phase, ph.other))
		case ph.num < 1:
			return invalid(fmt.Sprintf("%s %d < 1", ph.numName, ph.num))
		case ph.sum < ph.num:
			return invalid(fmt.Sprintf("%s %d < %s %d: every request %s", ph.sumName, ph.sum, ph.numName, ph.num, ph.each))
		}
	}
	var unsupported []string
	for _, f := range q.Features {
		if !supportedFeatures[f] {
			unsupported = append(unsupported, f)
		}
	}
	if len(unsupported) > 0 {
		return &refusal{Reason: reasonUnsupportedFeature, Features: unsupported,
			Detail: fmt.Sprintf("the sealed surfaces measure plain prefill and decode forward passes only; not %s",
				strings.Join(unsupported, ", "))}
	}
	return nil
}

// Phase returns the step's phase, inferring (and setting) it when empty: both parts set is mixed.
func (q *Query) Phase() string {
	if q.Step.Phase == "" {
		switch p, d := q.Step.hasPrefill(), q.Step.hasDecode(); {
		case p && d:
			q.Step.Phase = phaseMixed
		case p:
			q.Step.Phase = PhasePrefill
		case d:
			q.Step.Phase = PhaseDecode
		}
	}
	return q.Step.Phase
}

func invalid(detail string) *refusal { return &refusal{Reason: ReasonInvalidQuery, Detail: detail} }
