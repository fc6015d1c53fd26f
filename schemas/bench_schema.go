package schemas

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// JSON Schema documents (draft 2020-12, in schemaFS under jsonschema/) of the benchmark formats. The structural
// parts of the merge rules are expressed there; rules that relate fields (status consistency, coverage
// arithmetic, identical blocks across ranks, timing sums) are fpmbus's merger's job.
const (
	benchRankSchemaFile                = "bench-rank.schema.json"
	BenchMergedSchemaFile              = "bench-merged.schema.json"
	benchMeasurementProtocolSchemaFile = "bench-measurement-protocol.schema.json"
	benchMeasurementSchemaFile         = "bench-measurement.schema.json"
	benchSampleSchemaFile              = "bench-sample.schema.json"
	benchWarmupEvidenceSchemaFile      = "bench-warmup-evidence.schema.json"
	benchEngineSchemaFile              = "bench-engine.schema.json"
	BenchWorkerProbeSchemaFile         = "bench-worker-probe.schema.json"
	benchProbeRepliesSchemaFile        = "bench-probe-replies.schema.json"
)

// benchSchemaFiles lists the benchmark schema documents.
var benchSchemaFiles = []string{
	benchRankSchemaFile, BenchMergedSchemaFile, benchMeasurementProtocolSchemaFile, benchMeasurementSchemaFile,
	benchSampleSchemaFile, benchWarmupEvidenceSchemaFile, benchEngineSchemaFile, BenchWorkerProbeSchemaFile,
	benchProbeRepliesSchemaFile,
}

var benchSchemas sync.Map // file name -> *jsonschema.Schema

// ValidateBenchDocument validates a JSON document against one of the benchmark schema documents (compiled
// once and cached). It reads the whole document into generic values, so it is meant for tests and
// tooling, not for the merge path of tens-of-megabyte artefacts.
func ValidateBenchDocument(schemaFile string, doc []byte) error {
	var s *jsonschema.Schema
	if v, ok := benchSchemas.Load(schemaFile); ok {
		s = v.(*jsonschema.Schema)
	} else {
		c, err := compileSchema(schemaFile)
		if err != nil {
			return err
		}
		benchSchemas.Store(schemaFile, c)
		s = c
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("schemas: %s: parse document: %w", schemaFile, err)
	}
	if err := s.Validate(inst); err != nil {
		return fmt.Errorf("schemas: %s: %w", schemaFile, err)
	}
	return nil
}
