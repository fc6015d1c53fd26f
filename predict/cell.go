package predict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
)

// cell is one loaded value of a cell key in FPM_DATASETS: the sealed cell and its two surfaces, or,
// when it fails validation, what is wrong with it. A Cell is immutable once loaded.
type cell struct {
	Key      string
	Revision uint64
	// Value is the decoded sealed cell; nil when the bytes do not decode.
	Value *schemas.SealedCell
	// Problems are the validation failures ("rule: detail"), sorted; empty for a valid cell.
	Problems []string
	// Rules are the distinct rules of Problems, sorted.
	Rules []string

	prefill, decode *surface
}

// Valid reports whether the cell passed validation and may answer queries.
func (c *cell) Valid() bool { return len(c.Problems) == 0 }

// loadCell decodes and validates the value stored under key at revision. It never fails: a value that
// does not decode or does not pass validation loads as a corrupt Cell, which refuses every query.
//
// Checks: strict decoding (an unknown field is a schema mismatch: fail closed), the value's schema
// version, the value's key equal to the bucket key, and every rule of schemas.ValidateCell (the key is
// the identity's key, the dataset digest is the digest of identity and rows, row count, finite
// positive latencies, phase-valid and unique coordinates, ...).
func loadCell(key string, revision uint64, value []byte) *cell {
	c := &cell{Key: key, Revision: revision}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	var v schemas.SealedCell
	if err := dec.Decode(&v); err != nil {
		c.addProblem(schemas.RuleSchema, "sealed value does not decode: "+err.Error())
		return c
	}
	if dec.More() {
		c.addProblem(schemas.RuleSchema, "trailing data after the sealed value")
		return c
	}
	c.Value = &v
	if v.SchemaVersion != schemas.DatasetSchemaVersion {
		c.addProblem(schemas.RuleSchema, fmt.Sprintf("sealed value schema_version %d, supported %d", v.SchemaVersion, schemas.DatasetSchemaVersion))
	}
	if v.Key != key {
		c.addProblem(schemas.RuleIdentity, fmt.Sprintf("sealed value names key %q but is stored under %q", v.Key, key))
	}
	cell := schemas.Cell{Key: v.Key, Identity: v.Identity, Provenance: v.Provenance, Rows: v.Rows}
	for _, e := range schemas.ValidateCell(&cell, v.SchemaVersion) {
		detail := e.Detail
		if e.Row >= 0 {
			detail = fmt.Sprintf("row %d: %s", e.Row, detail)
		}
		c.addProblem(e.Rule, detail)
	}
	sort.Strings(c.Problems)
	sort.Strings(c.Rules)
	if c.Valid() {
		c.prefill = newSurface(PhasePrefill, v.Rows)
		c.decode = newSurface(PhaseDecode, v.Rows)
	}
	return c
}

func (c *cell) addProblem(rule schemas.Rule, detail string) {
	c.Problems = append(c.Problems, string(rule)+": "+detail)
	for _, r := range c.Rules {
		if r == string(rule) {
			return
		}
	}
	c.Rules = append(c.Rules, string(rule))
}

// Ref is the cell's reference in answers.
func (c *cell) Ref() *cellRef {
	r := &cellRef{Key: c.Key, Revision: c.Revision}
	if v := c.Value; v != nil {
		id := v.Identity
		r.DatasetDigest, r.RunID, r.CampaignID, r.SealedBy, r.Identity = v.Provenance.DatasetDigest, v.Provenance.RunID, v.CampaignID, v.Source, &id
	}
	return r
}

// Rows returns the number of measured rows of each surface (0, 0 for a corrupt cell).
func (c *cell) Rows() (prefill, decode int) {
	if !c.Valid() {
		return 0, 0
	}
	return len(c.prefill.rows), len(c.decode.rows)
}

func (c *cell) surface(phase string) *surface {
	if phase == PhasePrefill {
		return c.prefill
	}
	return c.decode
}

func (c *cell) corruptRefusal() *refusal {
	return &refusal{Reason: reasonCorruptCell, Rules: c.Rules,
		Detail: fmt.Sprintf("sealed cell %s (revision %d) fails validation and is not used: %s", c.Key, c.Revision, strings.Join(c.Problems, "; "))}
}
