package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestBenchJSONRoundTripKeepsOrderAndNumbers(t *testing.T) {
	src := `{"z":1,"a":{"y":[1,2.50,-0,1e-7,1E+400],"x":"caf\u00e9 \ud83d\ude00 \"q\" \\ \n"},"unknown_field":{"nested":[{}, []]},"n":null,"t":true}`
	doc, err := ParseBenchJSON([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(doc.Keys, ","); got != "z,a,unknown_field,n,t" {
		t.Fatalf("key order %s", got)
	}
	out := AppendBenchCompact(nil, doc)
	want := `{"z":1,"a":{"y":[1,2.50,-0,1e-7,1E+400],"x":"caf\u00e9 \ud83d\ude00 \"q\" \\ \n"},"unknown_field":{"nested":[{},[]]},"n":null,"t":true}`
	if string(out) != want {
		t.Fatalf("compact\n got %s\nwant %s", out, want)
	}
	// The indented form is Python's json.dump(indent=2).
	ind := AppendBenchJSON(nil, doc.Get("unknown_field"))
	if string(ind) != "{\n  \"nested\": [\n    {},\n    []\n  ]\n}" {
		t.Fatalf("indented %q", ind)
	}
	again, err := ParseBenchJSON(AppendBenchJSON(nil, doc))
	if err != nil || !BenchEqual(doc, again) {
		t.Fatalf("indented output does not round-trip: %v", err)
	}
}

func TestBenchJSONRejects(t *testing.T) {
	for name, src := range map[string]string{
		"duplicate key":         `{"a":1,"a":2}`,
		"duplicate key in many": `{` + manyKeys(40) + `,"k3":0}`,
		"trailing data":         `{} {}`,
		"trailing comma":        `[1,]`,
		"leading zero":          `[01]`,
		"NaN":                   `[NaN]`,
		"raw control char":      "[\"a\x01\"]",
		"invalid utf-8":         "[\"\xff\"]",
		"lone surrogate":        `["\ud800"]`,
		"bad escape":            `["\x"]`,
		"unterminated":          `{"a":`,
		"bom":                   "\xef\xbb\xbf{}",
		"too deep":              strings.Repeat("[", benchMaxDepth+1) + strings.Repeat("]", benchMaxDepth+1),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseBenchJSON([]byte(src))
			var se *benchSyntaxError
			if !errors.Is(err, errBenchMalformed) || !errors.As(err, &se) {
				t.Fatalf("got %v, want a *BenchSyntaxError", err)
			}
		})
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strconv.Itoa(i) + `":0`)
	}
	return b.String()
}

func TestBenchEqualIsPythonEquality(t *testing.T) {
	for _, c := range []struct {
		a, b string
		eq   bool
		diff string
	}{
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`, true, ""},
		{`{"a":1}`, `{"a":1.0}`, true, ""},
		{`{"a":-0}`, `{"a":0}`, true, ""},
		{`{"a":9007199254740993}`, `{"a":9007199254740992.0}`, false, "a"},
		{`{"a":{"b":[1,2]}}`, `{"a":{"b":[1,3]}}`, false, "a.b[1]"},
		{`{"a":1}`, `{"a":1,"b":null}`, false, "b"},
		{`{"a":true}`, `{"a":1}`, false, "a"},
		{`[{"x":"1"}]`, `[{"x":"1"}]`, true, ""},
	} {
		a, _ := ParseBenchJSON([]byte(c.a))
		b, _ := ParseBenchJSON([]byte(c.b))
		if got := BenchEqual(a, b); got != c.eq {
			t.Errorf("%s == %s: %v, want %v", c.a, c.b, got, c.eq)
		}
		if got := BenchDiff(a, b); got != c.diff {
			t.Errorf("diff %s %s: %q, want %q", c.a, c.b, got, c.diff)
		}
	}
}

var pointOne = 0.1 // a variable, so 0.1 + 0.2 is computed in float64 rather than folded exactly

func TestBenchPythonFloat(t *testing.T) {
	for f, want := range map[float64]string{
		10: "10.0", 0.1: "0.1", 0.0001: "0.0001", 0.00001: "1e-05", 1.5e-7: "1.5e-07", 1234567.0: "1234567.0",
		1e16: "1e+16", 1.5e16: "1.5e+16", 123456789012345.6: "123456789012345.6", -2.5: "-2.5", 0: "0.0",
		pointOne + 0.2: "0.30000000000000004", 1e22: "1e+22", math.SmallestNonzeroFloat64: "5e-324",
	} {
		if got := string(AppendPythonFloat(nil, f)); got != want {
			t.Errorf("%v: %s, want %s", f, got, want)
		}
	}
}

func TestBenchHeaderKeepsLargeArraysRaw(t *testing.T) {
	src := `{"run_id":"r","results":[{"point":{"benchmark_id":1}},{"a":[1]}],"iteration_groups":[],"other":[{"b":2}]}`
	doc, err := parseBenchHeader([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	res := doc.Get("results")
	if res.Len() != 2 || !res.Kids[0].Raw() || res.Kids[0].Str != `{"point":{"benchmark_id":1}}` {
		t.Fatalf("results %+v", res)
	}
	if doc.Get("other").Kids[0].Raw() {
		t.Fatalf("other arrays must be built")
	}
	if _, err := parseBenchHeader([]byte(`{"results":[{"a":}]}`)); err == nil {
		t.Fatalf("a syntax error inside a raw element must still be reported")
	}
}

// TestBenchSchemasValidateExamples validates testdata/bench (copies of the merger's golden inputs and
// outputs, refreshed by go test ./consumers/merge -run TestBenchGolden -update) against the JSON Schema
// documents, and decodes them into the typed views.
func TestBenchSchemasValidateExamples(t *testing.T) {
	for _, f := range benchSchemaFiles {
		if _, err := compileSchema(f); err != nil {
			t.Fatalf("compile %s: %v", f, err)
		}
	}
	cases := map[string]struct {
		schema string
		typed  any
	}{
		"rank-legacy.json":             {benchRankSchemaFile, &benchRankArtifact{}},
		"rank-protocol.json":           {benchRankSchemaFile, &benchRankArtifact{}},
		"merged-legacy.json":           {BenchMergedSchemaFile, &benchMergedArtifact{}},
		"merged-protocol.json":         {BenchMergedSchemaFile, &benchMergedArtifact{}},
		"merged-capture-failed.json":   {BenchMergedSchemaFile, &benchMergedArtifact{}},
		"worker-probe-rank0-only.json": {BenchWorkerProbeSchemaFile, &WorkerProbeSidecar{}},
		"worker-probe-no-replies.json": {BenchWorkerProbeSchemaFile, &WorkerProbeSidecar{}},
		"probe-replies.json":           {benchProbeRepliesSchemaFile, &[]workerProbeReply{}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "bench", name))
			if err != nil {
				t.Fatal(err)
			}
			if err := ValidateBenchDocument(c.schema, b); err != nil {
				t.Fatal(err)
			}
			if err := decodeBenchTyped(b, c.typed); err != nil {
				t.Fatal(err)
			}
			doc, err := ParseBenchJSON(b)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(AppendBenchJSON(nil, doc), b) {
				t.Fatalf("parse + write is not byte-identical")
			}
		})
	}
	// Typed views carry the fields the rules read.
	var m benchMergedArtifact
	b, _ := os.ReadFile(filepath.Join("testdata", "bench", "merged-capture-failed.json"))
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.Engine == nil || m.Engine.CaptureErrors["3"] != EngineMissingBlock || m.Engine.Parallel.DataParallelRank != nil {
		t.Fatalf("merged engine view %+v", m.Engine)
	}
	if m.RankWarmupEvidence["0"].Status != "recorded" || m.DP.GlobalSize != 4 {
		t.Fatalf("merged view %+v", m.DP)
	}
}

func TestBenchSchemasRejectBrokenDocuments(t *testing.T) {
	for name, c := range map[string]struct{ schema, doc string }{
		"rank with schema_version 3":      {benchRankSchemaFile, `{"schema_version":3,"run_id":"r","grid_digest":"g","timing":{},"dp":{"rank":0,"size":1},"coverage":{},"results":[],"iteration_groups":[]}`},
		"observed graph without counts":   {benchSampleSchemaFile, `{"sample_index":0,"forward_index":1,"timing":{"basis":"inter_output","start_monotonic":null,"end_monotonic":1.0},"cudagraph":{"status":"observed","runtime_mode":"FULL"}}`},
		"unavailable graph with a mode":   {benchSampleSchemaFile, `{"sample_index":0,"forward_index":1,"timing":{"basis":"inter_output","end_monotonic":1.0},"cudagraph":{"status":"unavailable","runtime_mode":"NONE"}}`},
		"unavailable ledger with records": {benchWarmupEvidenceSchemaFile, `{"status":"unavailable","records":[{"status":"completed","validation":{"status":"passed"}}]}`},
		"sidecar of another schema":       {BenchWorkerProbeSchemaFile, `{"schema":"x","schema_version":1}`},
	} {
		t.Run(name, func(t *testing.T) {
			if err := ValidateBenchDocument(c.schema, []byte(c.doc)); err == nil {
				t.Fatalf("accepted")
			}
		})
	}
}

// FuzzBenchJSON checks that the benchmark parser never panics, and that what it accepts is written back
// in a form it reads as an equal tree, byte-identically on the second round.
func FuzzBenchJSON(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join("testdata", "bench", "*.json"))
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil && len(b) < 64<<10 {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"a":[1,2.5e-3,"\u00e9",{"b":null}],"c":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := ParseBenchJSON(data)
		hdr, herr := parseBenchHeader(data)
		if (err == nil) != (herr == nil) && !(err != nil && errors.Is(err, errBenchMalformed) && strings.Contains(err.Error(), "duplicate key")) {
			t.Fatalf("ParseBenchJSON %v but ParseBenchHeader %v", err, herr)
		}
		if err != nil {
			return
		}
		out := AppendBenchJSON(nil, doc)
		again, err := ParseBenchJSON(out)
		if err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		if !BenchEqual(doc, again) {
			t.Fatalf("round trip changed the document: %s", BenchDiff(doc, again))
		}
		if out2 := AppendBenchJSON(nil, again); !bytes.Equal(out, out2) {
			t.Fatalf("second round is not byte-identical")
		}
		if !BenchEqual(hdr, doc) && hdr.IsObject() && !hdr.Get("results").IsArray() && !hdr.Get("iteration_groups").IsArray() {
			t.Fatalf("header parse differs outside the raw arrays")
		}
		// The scanner reads the same document as the parser, and compares it equal to its own tree.
		s := NewBenchScanner(data)
		if d, err := s.Compare(doc); err != nil || d != "" {
			t.Fatalf("scanner compares the document with its own tree: %q, %v", d, err)
		}
		if err := s.Finish(); err != nil {
			t.Fatalf("scanner finish: %v", err)
		}
		s = NewBenchScanner(data)
		if err := s.SkipUnchecked(); err != nil {
			t.Fatalf("SkipUnchecked on a valid document: %v", err)
		}
		if err := s.Finish(); err != nil {
			t.Fatalf("SkipUnchecked stopped early: %v", err)
		}
	})
}

func TestBenchScannerCompare(t *testing.T) {
	ref, err := ParseBenchJSON([]byte(`{"a":[1,{"b":"x","c":null}],"d":2.0,"":true}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ src, want string }{
		{`{"d":2,"":true,"a":[1.0,{"c":null,"b":"x"}]}`, ""}, // member order and 2 == 2.0 do not matter
		{`{"a":[1,{"b":"y","c":null}],"d":2.0,"":true}`, "a[1].b"},
		{`{"a":[1],"d":2.0,"":true}`, "a[1]"},
		{`{"a":[1,{"b":"x","c":null},3],"d":2.0,"":true}`, "a[2]"},
		{`{"a":[1,{"b":"x","c":null}],"d":2.0,"":true,"e":1}`, "e"},
		{`{"a":[1,{"b":"x","c":null}],"d":2.0}`, "."},          // the missing key is the empty string
		{`{"a":[1,{"b":"x","c":null}],"d":2.0,"":false}`, "."}, // likewise
		{`[]`, "."},
	} {
		d, err := NewBenchScanner([]byte(c.src)).Compare(ref)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		if d != c.want {
			t.Errorf("%s: diff %q, want %q", c.src, d, c.want)
		}
	}
	if _, err := NewBenchScanner([]byte(`{"d":2,"d":2,"":true}`)).Compare(ref); !errors.Is(err, errBenchMalformed) {
		t.Fatalf("a duplicate key must be malformed: %v", err)
	}
}

func TestBenchScannerWalk(t *testing.T) {
	src := []byte(`{"results":[{"x":1},{"y":[2,"]}"]}],"n":5,"skip":{"deep":[[["}"]]]}}`)
	s := NewBenchScanner(src)
	var got []string
	err := s.Object(func(key string) error {
		switch key {
		case "results":
			return s.Array(func(i int) error {
				v, err := s.Parse()
				got = append(got, key+strconv.Itoa(i)+"="+string(AppendBenchCompact(nil, &v)))
				return err
			})
		case "skip":
			return s.SkipUnchecked()
		}
		v, err := s.Parse()
		got = append(got, key+"="+v.Str)
		return err
	})
	if err != nil || s.Finish() != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != `results0={"x":1} results1={"y":[2,"]}"]} n=5` {
		t.Fatalf("walk %v", got)
	}
	dup := NewBenchScanner([]byte(`{"a":1,"a":2}`))
	if err := dup.Object(func(string) error { return dup.Skip() }); !errors.Is(err, errBenchMalformed) || !strings.Contains(err.Error(), "duplicate key") {
		t.Fatalf("duplicate keys: %v", err)
	}
}
