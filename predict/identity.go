package predict

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// maxClosest bounds the closest identities an unknown_identity refusal lists.
const maxClosest = 3

// checkIdentity returns why id is not a usable cell identity ("" when it is): the same identity rules
// a cell passes before it is sealed (schemas.ValidateCell), so a query can never name a key no valid
// cell could have.
func checkIdentity(id schemas.CellIdentity) string {
	probe := schemas.Cell{Key: id.Key(), Identity: id}
	var why []string
	for _, e := range schemas.ValidateCell(&probe, schemas.DatasetSchemaVersion) {
		if e.Rule == schemas.RuleIdentity || e.Rule == schemas.RuleSchema || e.Rule == schemas.RuleForbiddenContent {
			why = append(why, e.Detail)
		}
	}
	sort.Strings(why)
	return strings.Join(why, "; ")
}

// closest ranks the valid sealed cells by how many identity fields differ from id (fewest first, then
// by key) and returns the first maxClosest with the differing fields.
func (s *Snapshot) closest(id schemas.CellIdentity) []identityMatch {
	want := flattenIdentity(id)
	var ms []identityMatch
	for _, c := range s.Cells() {
		if !c.Valid() {
			continue
		}
		ms = append(ms, identityMatch{Key: c.Key, Differs: diffFields(want, flattenIdentity(c.Value.Identity))})
	}
	sort.SliceStable(ms, func(i, j int) bool { return len(ms[i].Differs) < len(ms[j].Differs) })
	if len(ms) > maxClosest {
		ms = ms[:maxClosest]
	}
	return ms
}

// flattenIdentity maps every leaf of the identity's JSON to its dotted field name
// ("parallelism.tp", "backend_selections.attention_backend"), so new identity fields are compared
// without being listed here.
func flattenIdentity(id schemas.CellIdentity) map[string]string {
	b, _ := json.Marshal(id)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, vv := range x {
				name := k
				if prefix != "" {
					name = prefix + "." + k
				}
				walk(name, vv)
			}
		case nil:
		default:
			out[prefix] = fmt.Sprint(x)
		}
	}
	walk("", m)
	return out
}

func diffFields(query, sealed map[string]string) []fieldDiff {
	var ds []fieldDiff
	for f, q := range query {
		if s, ok := sealed[f]; !ok || s != q {
			ds = append(ds, fieldDiff{Field: f, Query: q, Sealed: s})
		}
	}
	for f, s := range sealed {
		if _, ok := query[f]; !ok {
			ds = append(ds, fieldDiff{Field: f, Sealed: s})
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].Field < ds[j].Field })
	return ds
}
