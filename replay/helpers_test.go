package replay

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/fpmbus/fpmbus/producer"
	"github.com/fpmbus/fpmbus/schemas"
)

// fpmJSON returns the canonical JSON of a synthetic FPM (the engine's, seeded by counter), as a
// worker would have sent it and a trace writer recorded it.
func fpmJSON(t testing.TB, worker string, rank int, counter int64) []byte {
	t.Helper()
	e := producer.NewEngine(counter, worker, rank)
	f, ok := e.Step()
	for !ok {
		f, ok = e.Step()
	}
	f.CounterID = counter
	return canonical(t, schemas.EncodeMsgpack(&f))
}

// canonical decodes a msgpack payload and returns its canonical JSON.
func canonical(t testing.TB, payload []byte) []byte {
	t.Helper()
	f, err := schemas.DecodeFPM(payload)
	if err != nil {
		t.Fatalf("decode %x: %v", payload, err)
	}
	return f.JSON
}

// canonicalOf returns the canonical JSON of the FPM object written in JSON (any unknown fields kept):
// what a trace holds for a worker that sent that object.
func canonicalOf(t testing.TB, obj string) []byte {
	t.Helper()
	p, err := transcode(nil, []byte(obj), nil)
	if err != nil {
		t.Fatalf("transcode %s: %v", obj, err)
	}
	return canonical(t, p.bytes)
}

// line is one trace line.
type line struct {
	producer string
	mode     string
	observed int64
	fpm      []byte
}

func (l line) bytes() []byte {
	mode := l.mode
	if mode == "" {
		mode = schemas.CaptureFull
	}
	tl := schemas.TraceLine{Timestamp: 0, Event: schemas.TraceEvent{Schema: schemas.TraceSchema,
		Source:      schemas.TraceSource{Namespace: "dynamo", Component: "backend", ProducerID: l.producer},
		CaptureMode: mode, ObservedAtUnixMs: l.observed, FPM: l.fpm}}
	return append(schemas.AppendTraceLine(nil, &tl), '\n')
}

// gzMember compresses lines into one gzip member.
func gzMember(t testing.TB, lines ...[]byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	for _, l := range lines {
		if _, err := zw.Write(l); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// writeFile writes data to dir/name and returns the path.
func writeFile(t testing.TB, dir, name string, data ...[]byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, bytes.Join(data, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// segName is Dynamo's segment file name of producer under base fpm.
func segName(producer string, index int) string {
	return "fpm." + producer + "." + pad6(index) + ".jsonl.gz"
}

func pad6(i int) string {
	s := strconv.Itoa(i)
	for len(s) < 6 {
		s = "0" + s
	}
	return s
}

// recordingOf builds a Recording directly (schedule order as given by observed times).
func recordingOf(t testing.TB, ls ...line) *Recording {
	t.Helper()
	rec := &Recording{}
	lr := newLineReader(rec)
	lr.file = "test"
	for _, l := range ls {
		if err := lr.take(bytes.TrimSuffix(l.bytes(), []byte{'\n'})); err != nil {
			t.Fatal(err)
		}
	}
	sortRecords(rec.Records)
	return rec
}
