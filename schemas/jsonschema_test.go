package schemas

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

func compileSchemaT(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	s, err := compileSchema(name)
	if err != nil {
		t.Fatalf("CompileSchema(%s): %v", name, err)
	}
	return s
}

func validateSchemaDoc(t *testing.T, s *jsonschema.Schema, doc []byte) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatalf("UnmarshalJSON(%s): %v", doc, err)
	}
	return s.Validate(v)
}

func TestSchemasAcceptEncoderOutput(t *testing.T) {
	fpmSchema := compileSchemaT(t, fpmSchemaFile)
	lineSchema := compileSchemaT(t, traceLineSchemaFile)
	payloads := map[string][]byte{
		"seed example":   goldenPayload(),
		"heartbeat":      heartbeatPayload(),
		"unknown fields": unknownFieldsPayload(),
	}
	for name, payload := range payloads {
		t.Run(name, func(t *testing.T) {
			f := mustDecodeFPM(t, payload)
			if err := validateSchemaDoc(t, fpmSchema, f.JSON); err != nil {
				t.Errorf("fpm.schema.json rejects DecodeFPM output: %v", err)
			}
		})
	}
	for name, l := range traceLines(t) {
		t.Run("line "+name, func(t *testing.T) {
			if err := validateSchemaDoc(t, lineSchema, AppendTraceLine(nil, &l)); err != nil {
				t.Errorf("trace-line.schema.json rejects AppendTraceLine output: %v", err)
			}
		})
	}
}

func TestSchemasRejectInvalidDocuments(t *testing.T) {
	fpmSub := func(old, new string) []byte {
		if !strings.Contains(goldenJSON, old) {
			t.Fatalf("golden JSON has no %s", old)
		}
		return []byte(strings.Replace(goldenJSON, old, new, 1))
	}
	lineSub := func(old, new string) []byte {
		if !strings.Contains(seedLineJSON, old) {
			t.Fatalf("seed line has no %s", old)
		}
		return []byte(strings.Replace(seedLineJSON, old, new, 1))
	}
	tests := map[string]struct {
		schema string
		doc    []byte
	}{
		"fpm version 2":          {fpmSchemaFile, fpmSub(`"version":1`, `"version":2`)},
		"fpm missing counter_id": {fpmSchemaFile, fpmSub(`"counter_id":42,`, ``)},
		"fpm missing nested":     {fpmSchemaFile, fpmSub(`"sum_prefill_kv_tokens":64,`, ``)},
		"fpm negative count":     {fpmSchemaFile, fpmSub(`"num_decode_requests":3`, `"num_decode_requests":-3`)},
		"fpm fractional count":   {fpmSchemaFile, fpmSub(`"num_decode_requests":3`, `"num_decode_requests":3.5`)},
		"fpm count beyond int64": {fpmSchemaFile, fpmSub(`"counter_id":42`, `"counter_id":9223372036854775808`)},
		"fpm negative variance":  {fpmSchemaFile, fpmSub(`"var_prefill_length":12.5`, `"var_prefill_length":-0.5`)},
		"fpm wall_time string":   {fpmSchemaFile, fpmSub(`"wall_time":0.025`, `"wall_time":"0.025"`)},
		"fpm worker_id number":   {fpmSchemaFile, fpmSub(`"worker_id":"4192"`, `"worker_id":4192`)},
		"fpm request map null":   {fpmSchemaFile, fpmSub(`"queued_requests":{`, `"queued_requests":null,"x":{`)},
		"fpm not an object":      {fpmSchemaFile, []byte(`[1]`)},
		"line wrong schema":      {traceLineSchemaFile, lineSub(`"dynamo.fpm.trace.v1"`, `"dynamo.fpm.trace.v2"`)},
		"line capture mode":      {traceLineSchemaFile, lineSub(`"sampled"`, `"both"`)},
		"line extra field":       {traceLineSchemaFile, lineSub(`"capture_mode"`, `"extra":1,"capture_mode"`)},
		"line negative time":     {traceLineSchemaFile, lineSub(`"timestamp":1250`, `"timestamp":-1`)},
		"line missing source":    {traceLineSchemaFile, lineSub(`"source":{"namespace":"default","component":"backend","producer_id":"4192"},`, ``)},
		"line invalid fpm":       {traceLineSchemaFile, lineSub(`"version":1`, `"version":2`)},
		"line fpm negative":      {traceLineSchemaFile, lineSub(`"sum_decode_kv_tokens":0`, `"sum_decode_kv_tokens":-1`)},
	}
	schemas := map[string]*jsonschema.Schema{
		fpmSchemaFile:       compileSchemaT(t, fpmSchemaFile),
		traceLineSchemaFile: compileSchemaT(t, traceLineSchemaFile),
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := validateSchemaDoc(t, schemas[tc.schema], tc.doc)
			var ve *jsonschema.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("%s accepted %s (err %v)", tc.schema, tc.doc, err)
			}
			// The package's own parsers reject the same documents.
			if tc.schema == fpmSchemaFile {
				if _, err := ParseFPMJSON(tc.doc); err == nil {
					t.Errorf("ParseFPMJSON accepted it")
				}
			} else if _, err := ParseTraceLine(tc.doc); err == nil {
				t.Errorf("ParseTraceLine accepted it")
			}
		})
	}
}

func TestCompileSchemaUnknownName(t *testing.T) {
	if _, err := compileSchema("nope.schema.json"); err == nil {
		t.Fatal("CompileSchema accepted an unknown name")
	}
}

func TestFSHoldsTheSchemas(t *testing.T) {
	for _, name := range []string{fpmSchemaFile, traceLineSchemaFile} {
		b, err := schemaFS.ReadFile("jsonschema/" + name)
		if err != nil {
			t.Fatalf("FS: %v", err)
		}
		if !bytes.Contains(b, []byte(`"$id": "`+schemaBaseURL+name+`"`)) {
			t.Errorf("%s: $id is not %s%s", name, schemaBaseURL, name)
		}
	}
}
