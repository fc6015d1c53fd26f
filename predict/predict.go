package predict

import (
	"fmt"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// Options are the caller's settings, the same for every query it asks.
type Options struct {
	// RequireComplete refuses every cell whose campaign is not complete (incomplete_campaign); a query
	// can ask for it too (Query.RequireComplete), never turn it off.
	RequireComplete bool
}

// Predict answers q from the snapshot. Checks run in this order and the first failure is the refusal:
// the query's form (invalid_query), its features and phase (unsupported_feature), the identity
// (wrong_identity, unknown_identity), the sealed value (corrupt_cell), the campaign when complete
// campaigns are required (incomplete_campaign), the domain of every surface evaluation
// (out_of_domain). Otherwise the answer carries the latency.
func (s *Snapshot) Predict(q Query, o Options) Answer {
	invalid := q.normalize()
	a := newAnswer(q)
	if invalid != nil {
		// The query is refused before its deployment is checked; still name the cell it asks for when
		// there is one, so that every answer that can carry its cell does.
		if c := s.Cell(q.Key); c != nil && (q.Identity == nil || q.Identity.Key() == q.Key) {
			a.Cell = c.Ref()
		} else if q.Identity != nil && q.Key == "" {
			if c := s.Cell(q.Identity.Key()); c != nil {
				a.Cell = c.Ref()
			}
		}
		return a.refuse(invalid)
	}
	key := q.Key
	if q.Identity != nil {
		if why := checkIdentity(*q.Identity); why != "" {
			return a.refuse(&refusal{Reason: reasonWrongIdentity, Detail: "the identity is not a valid cell identity: " + why})
		}
		key = q.Identity.Key()
		if q.Key != "" && q.Key != key {
			return a.refuse(&refusal{Reason: reasonWrongIdentity,
				Detail: fmt.Sprintf("key %s is not the identity's key %s", q.Key, key)})
		}
	} else if !strings.HasPrefix(key, schemas.CellKeyPrefix) {
		return a.refuse(&refusal{Reason: reasonWrongIdentity, Detail: fmt.Sprintf("key %q is not a cell key (%s<sha256>)", key, schemas.CellKeyPrefix)})
	}
	cell := s.Cell(key)
	if cell == nil {
		r := &refusal{Reason: ReasonUnknownIdentity, Detail: fmt.Sprintf("nothing is sealed under %s", key)}
		if q.Identity != nil {
			r.Closest = s.closest(*q.Identity)
			if len(r.Closest) > 0 {
				r.Detail += fmt.Sprintf("; the closest sealed identity differs in %d field(s)", len(r.Closest[0].Differs))
			}
		}
		a.Cell = &cellRef{Key: key}
		return a.refuse(r)
	}
	a.Cell = cell.Ref()
	if !cell.Valid() {
		return a.refuse(cell.corruptRefusal())
	}
	if o.RequireComplete || q.RequireComplete {
		if r := s.campaignRefusal(cell); r != nil {
			return a.refuse(r)
		}
	}
	st := q.Step
	switch st.Phase {
	case PhasePrefill, PhaseDecode:
		p, d := cell.evaluate(st.Phase, st.Phase, rawCoords(st.Phase, stepRow(st)))
		if d != nil {
			return a.refuse(&refusal{Reason: ReasonOutOfDomain, Domain: d, Detail: d.String()})
		}
		a.Status, a.Parts = p.Status, []part{*p}
		a.LatencyMS = &p.LatencyMS
		return a
	}
	return cell.composeMixed(a, st)
}

func (s *Snapshot) campaignRefusal(cell *cell) *refusal {
	id := cell.Value.CampaignID
	if id == "" {
		return &refusal{Reason: ReasonIncompleteCampaign, Detail: fmt.Sprintf("cell %s was sealed outside any campaign: its completeness is unknown", cell.Key)}
	}
	c := s.Campaign(id)
	if c == nil {
		return &refusal{Reason: ReasonIncompleteCampaign, Campaign: &campaignState{ID: id, State: "absent"},
			Detail: fmt.Sprintf("campaign %s of cell %s has no record in the bucket", id, cell.Key)}
	}
	if st := c.completeness(); st != nil {
		d := fmt.Sprintf("campaign %s is %s: %d planned cell(s) not sealed", id, st.State, len(st.Missing))
		if c.Problem != "" {
			d = fmt.Sprintf("campaign %s: %s", id, c.Problem)
		}
		return &refusal{Reason: ReasonIncompleteCampaign, Campaign: st, Detail: d}
	}
	return nil
}

// stepRow carries a step's coordinates as a row (for rawCoords).
func stepRow(s Step) schemas.Row {
	return schemas.Row{NumPrefillRequests: s.NumPrefillRequests, SumPrefillTokens: s.SumPrefillTokens,
		SumPrefillKVTokens: s.SumPrefillKVTokens, NumDecodeRequests: s.NumDecodeRequests, SumDecodeKVTokens: s.SumDecodeKVTokens}
}

// evaluate evaluates the phase surface at raw coordinates: an exact row is measured (its latency
// returned unchanged), anything else is interpolated or out of domain.
func (c *cell) evaluate(role, phase string, raw [3]int64) (*part, *domainViolation) {
	s := c.surface(phase)
	x := gridCoords(len(s.axes), raw)
	if i, ok := s.exact[raw]; ok {
		r := s.rows[i]
		return &part{Role: role, Surface: phase, Status: StatusMeasured, LatencyMS: r.LatencyMS, At: s.rawAt(raw),
			Points: []point{{Row: r, Weight: 1}}}, nil
	}
	return s.evaluateGrid(role, x, &raw)
}

// evaluateGrid evaluates at grid coordinates x, which may be fractional (the decode baseline between
// measured batch sizes); raw, when known, are the query's own coordinates, reported as they were given.
func (s *surface) evaluateGrid(role string, x []float64, raw *[3]int64) (*part, *domainViolation) {
	cs, v := s.eval(x)
	if v != nil {
		return nil, s.domain(role, v, x, raw)
	}
	p := &part{Role: role, Surface: s.phase, Status: StatusInterpolated, LatencyMS: s.value(cs)}
	switch {
	case len(cs) == 1: // every coordinate on a measured value: the row itself
		r := s.rows[cs[0].row]
		p.Status, p.LatencyMS, p.At = StatusMeasured, r.LatencyMS, s.rawAt(rawCoords(s.phase, r))
	case raw != nil:
		p.At = s.rawAt(*raw)
	default:
		p.At = map[string]float64{s.axes[0]: x[0]}
		for i := 1; i < len(s.axes); i++ {
			p.At[s.axes[i]] = x[i] * x[0]
		}
	}
	for _, c := range cs {
		p.Points = append(p.Points, point{Row: s.rows[c.row], Weight: c.weight})
	}
	return p, nil
}

// rawAt names raw coordinates by their FPM fields.
func (s *surface) rawAt(raw [3]int64) map[string]float64 {
	m := map[string]float64{}
	for i, a := range s.axes {
		m[a] = float64(raw[i])
	}
	return m
}
