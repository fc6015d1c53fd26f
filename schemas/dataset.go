package schemas

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// A dataset is a set of sealed FPM cells: for one exact engine identity, the pure-prefill and pure-decode
// latency rows of one collection run. This file defines the dataset file (`fpmbus datasets publish FILE`,
// schema jsonschema/dataset-file.schema.json), the cell identity and its key, the value sealed in the KV
// bucket FPM_DATASETS, and the validation every cell passes before any write: mismatched schemas,
// identities, digests, row counts or run ids, duplicate keys, non-finite or non-positive latencies,
// coordinates impossible for the row's phase and mixed backend versions are rejected.
//
// Invariants:
//   - A cell's key is "cell." + sha256 of the canonical JSON of its identity. Two identities that differ in
//     any field (backend version, profile version, schema version included) have different keys, so data
//     sealed before a backend, collection-profile or schema upgrade never covers the upgraded identity.
//   - A cell's dataset digest is sha256 of the canonical JSON of {"identity", "rows"}: it covers the
//     measured data, not the provenance.
//   - Rows carry only FPM coordinates and a latency: no prompts, token ids, weights, secrets or
//     hostnames, so a dataset can be shared. Unknown fields in a dataset file are rejected, and so is an
//     identity string that looks like a path, URL, credential or host.

// DatasetSchemaVersion is the version of the dataset file, the cell identity and the sealed value.
const DatasetSchemaVersion = 1

// DatasetKind is the "kind" of a dataset file.
const DatasetKind = "fpm-dataset"

// CellKeyPrefix starts every cell key in FPM_DATASETS; CampaignKeyPrefix every campaign record's.
const (
	CellKeyPrefix     = "cell."
	CampaignKeyPrefix = "campaign."
)

// Row phases.
const (
	PhasePrefill = "prefill"
	PhaseDecode  = "decode"
)

// Parallelism is the cell's parallel layout (aiconfigurator's tp, pp, dp, moe_tp, moe_ep, cp).
type Parallelism struct {
	TP    int `json:"tp"`
	PP    int `json:"pp"`
	DP    int `json:"dp"`
	MoETP int `json:"moe_tp"`
	MoEEP int `json:"moe_ep"`
	CP    int `json:"cp"`
}

// CellIdentity identifies one FPM cell exactly: the model, hardware, backend and its version,
// quantization, KV cache dtype, parallel layout, backend selections and collection profile are fields.
// Settings that are not explicit fields are covered by SettingsDigest: sha256 of the canonical JSON of the
// engine block (identity-neutral members removed) together with the collection profile.
type CellIdentity struct {
	SchemaVersion     int               `json:"schema_version"`
	Model             string            `json:"model"`
	Hardware          string            `json:"hardware"`
	Backend           string            `json:"backend"`
	BackendVersion    string            `json:"backend_version"`
	Quantization      string            `json:"quantization"`
	KVCacheDType      string            `json:"kv_cache_dtype"`
	Parallelism       Parallelism       `json:"parallelism"`
	BackendSelections map[string]string `json:"backend_selections"`
	ProfileName       string            `json:"profile_name"`
	ProfileVersion    string            `json:"profile_version"`
	SettingsDigest    string            `json:"settings_digest"`
}

// Key returns the cell's key in FPM_DATASETS: "cell." + hex sha256 of the identity's canonical JSON.
func (id CellIdentity) Key() string {
	return CellKeyPrefix + sha256Hex(mustCanonicalJSON(id))
}

// Row is one measured point. Prefill rows set the three prefill coordinates, decode rows the two
// decode coordinates; LatencyMS is the maximum positive rank wall time of the point, in milliseconds.
type Row struct {
	Phase              string  `json:"phase"`
	NumPrefillRequests int64   `json:"num_prefill_requests,omitempty"`
	SumPrefillTokens   int64   `json:"sum_prefill_tokens,omitempty"`
	SumPrefillKVTokens int64   `json:"sum_prefill_kv_tokens,omitempty"`
	NumDecodeRequests  int64   `json:"num_decode_requests,omitempty"`
	SumDecodeKVTokens  int64   `json:"sum_decode_kv_tokens,omitempty"`
	LatencyMS          float64 `json:"latency_ms"`
}

// coordKey is the row's coordinate key (duplicate detection).
func (r Row) coordKey() string {
	return fmt.Sprintf("%s/%d/%d/%d/%d/%d", r.Phase, r.NumPrefillRequests, r.SumPrefillTokens,
		r.SumPrefillKVTokens, r.NumDecodeRequests, r.SumDecodeKVTokens)
}

// Provenance says where a cell's rows come from.
type Provenance struct {
	RunID          string `json:"run_id"`
	GridDigest     string `json:"grid_digest"`
	ArtefactDigest string `json:"artefact_digest"`
	DatasetDigest  string `json:"dataset_digest"`
	RowCount       int    `json:"row_count"`
}

// Cell is one cell of a dataset file.
type Cell struct {
	Key        string       `json:"key"`
	Identity   CellIdentity `json:"identity"`
	Provenance Provenance   `json:"provenance"`
	Rows       []Row        `json:"rows"`
}

// DatasetDigest computes the cell's dataset digest from its identity and rows. Rows that JSON cannot
// encode (a NaN or infinite latency) have no digest: the result is "" and never matches.
func (c *Cell) DatasetDigest() string {
	b, err := CanonicalJSON(struct {
		Identity CellIdentity `json:"identity"`
		Rows     []Row        `json:"rows"`
	}{c.Identity, c.Rows})
	if err != nil {
		return ""
	}
	return sha256Hex(b)
}

// Finish sets the key, row count and dataset digest from the identity and rows (producers call it last).
func (c *Cell) Finish() {
	if c.Identity.SchemaVersion == 0 {
		c.Identity.SchemaVersion = DatasetSchemaVersion
	}
	c.Key = c.Identity.Key()
	c.Provenance.RowCount = len(c.Rows)
	c.Provenance.DatasetDigest = c.DatasetDigest()
}

// Dataset is a dataset file: the cells of one collection run.
type Dataset struct {
	SchemaVersion int    `json:"schema_version"`
	Kind          string `json:"kind"`
	RunID         string `json:"run_id"`
	CampaignID    string `json:"campaign_id,omitempty"`
	Cells         []Cell `json:"cells"`
}

// SealedCell is the value of a cell key in FPM_DATASETS. AttemptID is unique per publication attempt:
// a publisher whose outcome is unknown (timeout, leader change) reads the key back and finds its own
// attempt id when its write won.
type SealedCell struct {
	SchemaVersion  int          `json:"schema_version"`
	Key            string       `json:"key"`
	Identity       CellIdentity `json:"identity"`
	Provenance     Provenance   `json:"provenance"`
	Rows           []Row        `json:"rows"`
	AttemptID      string       `json:"attempt_id"`
	CampaignID     string       `json:"campaign_id,omitempty"`
	Source         string       `json:"source"`
	SealedAtUnixMS int64        `json:"sealed_at_unix_ms"`
}

// SameAttempt reports whether s seals the same data from the same run as c: republishing it is an
// idempotent success, anything else is a conflict, since a sealed cell is never overwritten or combined
// with another run's data.
func (s *SealedCell) SameAttempt(c *Cell) bool {
	return s.Key == c.Key && s.Provenance.RunID == c.Provenance.RunID &&
		s.Provenance.DatasetDigest == c.Provenance.DatasetDigest
}

// Rule names one of the checks a dataset and its cells must pass before a cell is sealed.
type Rule string

// Validation rules. Every rejection names one of them and the cell and row it concerns.
const (
	RuleSchema           Rule = "schema_mismatch"        // schema version or kind, unknown fields, bad JSON
	RuleIdentity         Rule = "identity_mismatch"      // key is not the identity's key, identity incomplete, not the planned identity
	RuleDigest           Rule = "digest_mismatch"        // dataset digest is not the digest of identity and rows; artefact digest differs
	RuleRowCount         Rule = "row_count_mismatch"     // provenance row_count != len(rows), or no rows
	ruleRunID            Rule = "run_id_mismatch"        // cell run id missing or not the dataset's
	ruleDuplicateKey     Rule = "duplicate_key"          // two rows with the same coordinates, or two cells with one key
	RuleLatency          Rule = "latency_invalid"        // non-finite or non-positive latency
	rulePhase            Rule = "phase_invalid"          // coordinates impossible for the row's phase
	ruleMixedVersions    Rule = "mixed_backend_versions" // cells of one run with different backends or versions
	RuleForbiddenContent Rule = "forbidden_content"      // an identity string that looks like a path, URL or host
)

// DatasetError is one rejection: the rule, the cell (key or index) and the row (-1: the whole cell).
type DatasetError struct {
	Rule   Rule
	Cell   string
	Row    int
	Detail string
}

func (e *DatasetError) Error() string {
	where := "dataset"
	if e.Cell != "" {
		where = "cell " + e.Cell
	}
	if e.Row >= 0 {
		where += fmt.Sprintf(" row %d", e.Row)
	}
	return fmt.Sprintf("%s: %s: %s", where, e.Rule, e.Detail)
}

// errDatasetInvalid is wrapped by a ValidationErrors.
var errDatasetInvalid = errors.New("dataset: invalid")

// ValidationErrors is every rejection of one dataset.
type ValidationErrors []*DatasetError

func (v ValidationErrors) Error() string {
	parts := make([]string, len(v))
	for i, e := range v {
		parts[i] = e.Error()
	}
	return fmt.Sprintf("%v (%d rejection(s)): %s", errDatasetInvalid, len(v), strings.Join(parts, "; "))
}

func (v ValidationErrors) Unwrap() error { return errDatasetInvalid }

// ByCell groups the rejections by cell label.
func (v ValidationErrors) ByCell() map[string][]*DatasetError {
	out := map[string][]*DatasetError{}
	for _, e := range v {
		out[e.Cell] = append(out[e.Cell], e)
	}
	return out
}

// DecodeDataset parses a dataset file strictly: unknown fields are a schema rejection.
func DecodeDataset(r io.Reader) (*Dataset, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var d Dataset
	if err := dec.Decode(&d); err != nil {
		return nil, ValidationErrors{{Rule: RuleSchema, Row: -1, Detail: "decode: " + err.Error()}}
	}
	if dec.More() {
		return nil, ValidationErrors{{Rule: RuleSchema, Row: -1, Detail: "trailing data after the dataset object"}}
	}
	return &d, nil
}

// CellLabel is how rejections name cell i: its key when it has one, else its index.
func (d *Dataset) CellLabel(i int) string {
	if k := d.Cells[i].Key; k != "" {
		return k
	}
	return fmt.Sprintf("#%d", i)
}

// Validate applies every rule to every cell and returns all rejections (nil when the dataset passes).
// It never stops at the first problem, so a partial publication knows exactly which cells passed.
func (d *Dataset) Validate() ValidationErrors {
	var errs ValidationErrors
	add := func(rule Rule, cell string, row int, format string, args ...any) {
		errs = append(errs, &DatasetError{Rule: rule, Cell: cell, Row: row, Detail: fmt.Sprintf(format, args...)})
	}
	if d.SchemaVersion != DatasetSchemaVersion {
		add(RuleSchema, "", -1, "schema_version %d, want %d", d.SchemaVersion, DatasetSchemaVersion)
	}
	if d.Kind != DatasetKind {
		add(RuleSchema, "", -1, "kind %q, want %q", d.Kind, DatasetKind)
	}
	if d.RunID == "" {
		add(ruleRunID, "", -1, "run_id is empty")
	}
	if len(d.Cells) == 0 {
		add(RuleRowCount, "", -1, "no cells")
	}
	keys := map[string]int{}
	var firstBackend string
	for i := range d.Cells {
		c := &d.Cells[i]
		label := d.CellLabel(i)
		if j, dup := keys[c.Key]; dup && c.Key != "" {
			add(ruleDuplicateKey, label, -1, "cell key also used by cell #%d", j)
		}
		keys[c.Key] = i
		if bv := c.Identity.Backend + " " + c.Identity.BackendVersion; firstBackend == "" {
			firstBackend = bv
		} else if bv != firstBackend {
			add(ruleMixedVersions, label, -1, "backend %q, but an earlier cell of run %q has %q", bv, d.RunID, firstBackend)
		}
		for _, e := range ValidateCell(c, d.SchemaVersion) {
			e.Cell = label
			errs = append(errs, e)
		}
		if c.Provenance.RunID != d.RunID {
			add(ruleRunID, label, -1, "provenance run_id %q, dataset run_id %q", c.Provenance.RunID, d.RunID)
		}
	}
	return errs
}

// ValidateCell applies the per-cell rules; schemaVersion is the enclosing document's version.
func ValidateCell(c *Cell, schemaVersion int) ValidationErrors {
	var errs ValidationErrors
	add := func(rule Rule, row int, format string, args ...any) {
		errs = append(errs, &DatasetError{Rule: rule, Cell: c.Key, Row: row, Detail: fmt.Sprintf(format, args...)})
	}
	id := c.Identity
	if id.SchemaVersion != schemaVersion || id.SchemaVersion != DatasetSchemaVersion {
		add(RuleSchema, -1, "identity schema_version %d, document %d, supported %d", id.SchemaVersion, schemaVersion, DatasetSchemaVersion)
	}
	for name, v := range map[string]string{"model": id.Model, "hardware": id.Hardware, "backend": id.Backend,
		"backend_version": id.BackendVersion, "profile_version": id.ProfileVersion, "settings_digest": id.SettingsDigest} {
		if strings.TrimSpace(v) == "" {
			add(RuleIdentity, -1, "identity %s is empty", name)
		}
	}
	if p := id.Parallelism; p.TP < 1 || p.PP < 1 || p.DP < 1 {
		add(RuleIdentity, -1, "parallelism tp=%d pp=%d dp=%d: each must be at least 1", p.TP, p.PP, p.DP)
	}
	if want := id.Key(); c.Key != want {
		add(RuleIdentity, -1, "key %q is not the identity's key %q", c.Key, want)
	}
	for _, s := range []string{id.Model, id.Hardware, id.Backend, id.BackendVersion, id.ProfileName} {
		if looksLikeHostOrSecret(s) {
			add(RuleForbiddenContent, -1, "identity value %q looks like a URL, credential or host name", s)
		}
	}
	if c.Provenance.RunID == "" {
		add(ruleRunID, -1, "provenance run_id is empty")
	}
	if len(c.Rows) == 0 {
		add(RuleRowCount, -1, "cell has no rows")
	}
	if c.Provenance.RowCount != len(c.Rows) {
		add(RuleRowCount, -1, "provenance row_count %d, rows %d", c.Provenance.RowCount, len(c.Rows))
	}
	if want := c.DatasetDigest(); want != "" && c.Provenance.DatasetDigest != want {
		add(RuleDigest, -1, "dataset_digest %q, computed %q", c.Provenance.DatasetDigest, want)
	}
	if !isHexDigest(c.Provenance.ArtefactDigest) {
		add(RuleDigest, -1, "artefact_digest %q is not a hex sha256", c.Provenance.ArtefactDigest)
	}
	seen := map[string]int{}
	for i, r := range c.Rows {
		if math.IsNaN(r.LatencyMS) || math.IsInf(r.LatencyMS, 0) || r.LatencyMS <= 0 {
			add(RuleLatency, i, "latency_ms %v must be finite and positive", r.LatencyMS)
		}
		if why := phaseProblem(r); why != "" {
			add(rulePhase, i, "%s", why)
		}
		k := r.coordKey()
		if j, dup := seen[k]; dup {
			add(ruleDuplicateKey, i, "same coordinates as row %d", j)
		} else {
			seen[k] = i
		}
	}
	return errs
}

// phaseProblem says why r's coordinates are impossible for its phase ("" when they are fine).
func phaseProblem(r Row) string {
	switch r.Phase {
	case PhasePrefill:
		switch {
		case r.NumDecodeRequests != 0 || r.SumDecodeKVTokens != 0:
			return "prefill row carries decode coordinates"
		case r.NumPrefillRequests < 1:
			return fmt.Sprintf("num_prefill_requests %d < 1", r.NumPrefillRequests)
		case r.SumPrefillTokens < r.NumPrefillRequests:
			return fmt.Sprintf("sum_prefill_tokens %d < num_prefill_requests %d", r.SumPrefillTokens, r.NumPrefillRequests)
		case r.SumPrefillKVTokens < 0:
			return fmt.Sprintf("sum_prefill_kv_tokens %d < 0", r.SumPrefillKVTokens)
		}
	case PhaseDecode:
		switch {
		case r.NumPrefillRequests != 0 || r.SumPrefillTokens != 0 || r.SumPrefillKVTokens != 0:
			return "decode row carries prefill coordinates"
		case r.NumDecodeRequests < 1:
			return fmt.Sprintf("num_decode_requests %d < 1", r.NumDecodeRequests)
		case r.SumDecodeKVTokens < r.NumDecodeRequests:
			return fmt.Sprintf("sum_decode_kv_tokens %d < num_decode_requests %d", r.SumDecodeKVTokens, r.NumDecodeRequests)
		}
	default:
		return fmt.Sprintf("phase %q: want prefill or decode", r.Phase)
	}
	return ""
}

func looksLikeHostOrSecret(s string) bool {
	l := strings.ToLower(s)
	return strings.Contains(l, "://") || strings.Contains(l, "@") || strings.HasPrefix(l, "/") ||
		strings.Contains(l, "token=") || strings.Contains(l, "password") || strings.Contains(l, ".local")
}

func isHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// CanonicalJSON encodes v as canonical JSON: object keys sorted (structs are first converted to generic
// values), no insignificant whitespace, no HTML escaping, numbers as written.
func CanonicalJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var g any
	if err := dec.Decode(&g); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(g); err != nil { // encoding/json sorts map keys
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// mustCanonicalJSON is CanonicalJSON for values that always encode (the package's own types).
func mustCanonicalJSON(v any) []byte {
	b, err := CanonicalJSON(v)
	if err != nil {
		panic("schemas: canonical json: " + err.Error())
	}
	return b
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// SHA256Hex is the hex sha256 of b.
func SHA256Hex(b []byte) string { return sha256Hex(b) }

// SortRows orders rows by phase and coordinates (prefill first), the order producers write.
func SortRows(rows []Row) {
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Phase != b.Phase {
			return a.Phase == PhasePrefill
		}
		for _, p := range [][2]int64{{a.NumPrefillRequests, b.NumPrefillRequests}, {a.SumPrefillTokens, b.SumPrefillTokens},
			{a.SumPrefillKVTokens, b.SumPrefillKVTokens}, {a.NumDecodeRequests, b.NumDecodeRequests}, {a.SumDecodeKVTokens, b.SumDecodeKVTokens}} {
			if p[0] != p[1] {
				return p[0] < p[1]
			}
		}
		return false
	})
}

// datasetSchemaFile is the JSON Schema document of the dataset file in schemaFS.
const datasetSchemaFile = "dataset-file.schema.json"
