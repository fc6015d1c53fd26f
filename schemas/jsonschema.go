package schemas

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// schemaFS holds the JSON Schema documents (draft 2020-12) of the formats in this package, under jsonschema/:
// fpm.schema.json (the canonical FPM object) and trace-line.schema.json (the dynamo.fpm.trace.v1 line,
// which $refs fpm.schema.json). Each document's $id is schemaBaseURL + its file name.
//
//go:embed jsonschema/*.json
var schemaFS embed.FS

// Names of the schema documents in schemaFS, for compileSchema.
const (
	fpmSchemaFile       = "fpm.schema.json"
	traceLineSchemaFile = "trace-line.schema.json"
)

// schemaBaseURL is the base of the documents' $id values.
const schemaBaseURL = "https://github.com/fpmbus/fpmbus/schemas/jsonschema/"

// compileSchema compiles the schema document name (fpmSchemaFile or traceLineSchemaFile) with every
// document of schemaFS available to $ref, and without network access. Validate documents with
// Schema.Validate on a value from jsonschema.UnmarshalJSON (which keeps numbers exact).
func compileSchema(name string) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	entries, err := fs.ReadDir(schemaFS, "jsonschema")
	if err != nil {
		return nil, fmt.Errorf("schemas: read embedded schemas: %w", err)
	}
	found := false
	for _, e := range entries {
		b, err := schemaFS.ReadFile(path.Join("jsonschema", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("schemas: read embedded schema %s: %w", e.Name(), err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schemas: parse embedded schema %s: %w", e.Name(), err)
		}
		if err := c.AddResource(schemaBaseURL+e.Name(), doc); err != nil {
			return nil, fmt.Errorf("schemas: add schema %s: %w", e.Name(), err)
		}
		found = found || e.Name() == name
	}
	if !found {
		return nil, fmt.Errorf("schemas: no schema document %q", name)
	}
	s, err := c.Compile(schemaBaseURL + name)
	if err != nil {
		return nil, fmt.Errorf("schemas: compile %s: %w", name, err)
	}
	return s, nil
}
