package schemas

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// decodeFPMSlow and parseFPMJSONSlow are DecodeFPM and ParseFPMJSON as they were before the fast paths
// (fastpath.go): the general tree path alone. They are the reference the fast paths are checked against.

func decodeFPMSlow(payload []byte) (*FPM, error) {
	d := getDecoder(payload)
	defer putDecoder(d)
	if err := d.parseMsgpack(); err != nil {
		return nil, err
	}
	f := new(FPM)
	if err := validateFPM(&d.tree, 0, f); err != nil {
		return nil, err
	}
	d.out, _ = appendCanonical(d.out[:0], &d.tree, 0)
	f.JSON = append(make([]byte, 0, len(d.out)), d.out...)
	return f, nil
}

func parseFPMJSONSlow(body []byte) (*FPM, error) {
	d := getDecoder(body)
	defer putDecoder(d)
	if err := d.parseJSON(); err != nil {
		return nil, err
	}
	f := new(FPM)
	if err := validateFPM(&d.tree, 0, f); err != nil {
		return nil, err
	}
	f.JSON = body
	return f, nil
}

// exactFields is fpmFields with floats as bits, so -0.0 and 0.0 differ.
type exactFields struct {
	fpmFields
	bits [5]uint64
}

func exact(f *FPM) exactFields {
	e := exactFields{fpmFields: typedFields(f)}
	e.bits = [5]uint64{math.Float64bits(f.WallTime),
		math.Float64bits(f.Scheduled.VarPrefillLength), math.Float64bits(f.Scheduled.VarDecodeKVTokens),
		math.Float64bits(f.Queued.VarPrefillLength), math.Float64bits(f.Queued.VarDecodeKVTokens)}
	return e
}

// sameResult fails t unless (got, gotErr) is (want, wantErr): the same typed fields (floats bit for
// bit) and JSON bytes, or errors of the same type with the same fields, reason and message.
func sameResult(t *testing.T, what string, got *FPM, gotErr error, want *FPM, wantErr error) {
	t.Helper()
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%s: error %v, reference error %v", what, gotErr, wantErr)
	}
	if wantErr != nil {
		if got != nil {
			t.Fatalf("%s: FPM returned with an error", what)
		}
		switch w := wantErr.(type) {
		case *decodeError:
			g, ok := gotErr.(*decodeError)
			if !ok || g.Format != w.Format || g.Offset != w.Offset || g.Field != w.Field || g.Err.Error() != w.Err.Error() {
				t.Fatalf("%s: error %T %+v, reference %+v", what, gotErr, gotErr, w)
			}
		case *validationError:
			g, ok := gotErr.(*validationError)
			if !ok || *g != *w {
				t.Fatalf("%s: error %T %+v, reference %+v", what, gotErr, gotErr, w)
			}
		default:
			t.Fatalf("%s: reference error of unexpected type %T", what, wantErr)
		}
		if gotErr.Error() != wantErr.Error() {
			t.Fatalf("%s: error %q, reference %q", what, gotErr, wantErr)
		}
		return
	}
	if exact(got) != exact(want) {
		t.Fatalf("%s: typed fields\n got %+v\nwant %+v", what, exact(got), exact(want))
	}
	if !bytes.Equal(got.JSON, want.JSON) {
		t.Fatalf("%s: JSON\n got %s\nwant %s", what, got.JSON, want.JSON)
	}
}

// checkDecodeFPMMatchesReference runs every entry point of the msgpack decoder on payload and compares
// it with decodeFPMSlow. dec is reused across calls (its worker_id cache carries over).
func checkDecodeFPMMatchesReference(t *testing.T, dec *Decoder, payload []byte) (fast bool) {
	t.Helper()
	want, wantErr := decodeFPMSlow(payload)

	got, err := DecodeFPM(payload)
	sameResult(t, "DecodeFPM", got, err, want, wantErr)

	prev := FPM{WorkerID: "previous", JSON: []byte("previous")}
	f := prev
	err = dec.DecodeFPM(payload, &f)
	if err != nil {
		if exact(&f) != exact(&prev) || string(f.JSON) != "previous" {
			t.Fatalf("Decoder.DecodeFPM changed f on error")
		}
		sameResult(t, "Decoder.DecodeFPM", nil, err, want, wantErr)
	} else {
		sameResult(t, "Decoder.DecodeFPM", &f, nil, want, wantErr)
	}

	const prefix = "prefix"
	dst := append(make([]byte, 0, 8), prefix...)
	g := prev
	if want != nil {
		g.WorkerID = strings.Clone(want.WorkerID) // appendDecodeFPM keeps an equal WorkerID
	}
	before := g
	out, err := appendDecodeFPM(dst, payload, &g)
	if string(out[:len(prefix)]) != prefix {
		t.Fatalf("AppendDecodeFPM changed dst's bytes")
	}
	if err != nil {
		if len(out) != len(prefix) || exact(&g) != exact(&before) || string(g.JSON) != "previous" {
			t.Fatalf("AppendDecodeFPM changed dst's length or f on error")
		}
		sameResult(t, "AppendDecodeFPM", nil, err, want, wantErr)
	} else {
		if string(out[len(prefix):]) != string(g.JSON) || cap(g.JSON) != len(g.JSON) {
			t.Fatalf("AppendDecodeFPM: f.JSON is not the appended bytes (cap clipped)")
		}
		sameResult(t, "AppendDecodeFPM", &g, nil, want, wantErr)
	}

	// The fast path alone: what it accepts the reference accepts, with the same result.
	var h FPM
	out, wid, ok := appendFPMMsgpackFast([]byte("x"), payload, &h)
	if !ok {
		if string(out) != "x" {
			t.Fatalf("fast path failed but changed dst: %q", out)
		}
		return false
	}
	h.WorkerID, h.JSON = string(wid), out[1:]
	if wantErr != nil {
		t.Fatalf("fast path accepted a payload the reference rejects (%v): %s", wantErr, h.JSON)
	}
	sameResult(t, "appendFPMMsgpackFast", &h, nil, want, nil)
	return true
}

// checkParseFPMJSONMatchesReference is checkDecodeFPMMatchesReference for the JSON reader.
func checkParseFPMJSONMatchesReference(t *testing.T, dec *Decoder, body []byte) (fast bool) {
	t.Helper()
	want, wantErr := parseFPMJSONSlow(body)

	got, err := ParseFPMJSON(body)
	sameResult(t, "ParseFPMJSON", got, err, want, wantErr)
	if err == nil && (len(body) == 0 || &got.JSON[0] != &body[0] || len(got.JSON) != len(body)) {
		t.Fatalf("ParseFPMJSON: JSON is not body")
	}

	prev := FPM{WorkerID: "previous", JSON: []byte("previous")}
	f := prev
	err = dec.ParseFPMJSON(body, &f)
	if err != nil {
		if exact(&f) != exact(&prev) || string(f.JSON) != "previous" {
			t.Fatalf("Decoder.ParseFPMJSON changed f on error")
		}
		sameResult(t, "Decoder.ParseFPMJSON", nil, err, want, wantErr)
	} else {
		sameResult(t, "Decoder.ParseFPMJSON", &f, nil, want, wantErr)
	}

	var h FPM
	wid, ok := parseFPMJSONFast(body, &h)
	if !ok {
		return false
	}
	h.WorkerID, h.JSON = string(wid), body
	if wantErr != nil {
		t.Fatalf("fast path accepted a body the reference rejects (%v): %s", wantErr, body)
	}
	sameResult(t, "parseFPMJSONFast", &h, nil, want, nil)
	return true
}

// FuzzDecodeFPMFastMatchesReference: DecodeFPM, Decoder.DecodeFPM, appendDecodeFPM and the fast path
// alone give exactly what the general path (decodeFPMSlow) gives: the same typed fields and JSON bytes,
// or an error of the same type with the same Offset/Field/Reason. Seeds: testdata/fuzz/
// FuzzDecodeFPMFastMatchesReference (FuzzDecodeFPM's corpus) plus the unit tests' payloads.
func FuzzDecodeFPMFastMatchesReference(f *testing.F) {
	for _, p := range msgpackSeeds() {
		f.Add(p)
	}
	var dec Decoder
	f.Fuzz(func(t *testing.T, payload []byte) {
		checkDecodeFPMMatchesReference(t, &dec, payload)
	})
}

// FuzzParseFPMJSONFastMatchesReference is FuzzDecodeFPMFastMatchesReference for ParseFPMJSON and
// Decoder.ParseFPMJSON against parseFPMJSONSlow. Seeds: testdata/fuzz/
// FuzzParseFPMJSONFastMatchesReference plus the canonical JSON of the msgpack seeds and the unit tests'
// bodies.
func FuzzParseFPMJSONFastMatchesReference(f *testing.F) {
	for _, b := range jsonSeeds(f) {
		f.Add(b)
	}
	var dec Decoder
	f.Fuzz(func(t *testing.T, body []byte) {
		checkParseFPMJSONMatchesReference(t, &dec, body)
	})
}

// msgpackSeeds returns the payloads of the unit tests, valid and not, and variations of the golden
// payload that keep it on the fast path or push it just off it.
func msgpackSeeds() [][]byte {
	top := func() []mpKV { return goldenTop(goldenScheduled(), goldenQueued()) }
	seeds := [][]byte{goldenPayload(), heartbeatPayload(), unknownFieldsPayload(), mpDepthBomb(40)}
	for _, tc := range decodeErrorCases() {
		seeds = append(seeds, tc.payload)
	}
	reversed := func(kv []mpKV) []mpKV {
		out := make([]mpKV, len(kv))
		for i, e := range kv {
			out[len(kv)-1-i] = e
		}
		return out
	}
	seeds = append(seeds,
		mpMap(reversed(goldenTop(reversed(goldenScheduled()), reversed(goldenQueued())))...),
		mpMap(mpWith(top(), "wall_time", []byte{0x00})...),
		mpMap(mpWith(top(), "wall_time", mpF64(math.Copysign(0, -1)))...),
		mpMap(mpWith(top(), "wall_time", []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})...),
		mpMap(mpWith(top(), "wall_time", mpF64(1e300))...),
		mpMap(mpWith(top(), "wall_time", mpF64(5e-324))...),
		mpMap(mpWith(top(), "wall_time", []byte{0xd3, 0, 0, 0, 0, 0, 0, 0, 7})...),
		mpMap(mpWith(top(), "dp_rank", []byte{0xd0, 0x05})...),
		mpMap(mpWith(top(), "counter_id", []byte{0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})...),
		mpMap(mpWith(top(), "counter_id", []byte{0xd2, 0xff, 0xff, 0xff, 0xff})...),
		mpMap(mpWith(top(), "version", []byte{0xcd, 0x00, 0x01})...),
		mpMap(mpWith(top(), "worker_id", mpStr(strings.Repeat("w", 40)+"\"/\x01é"))...),
		mpMap(mpWith(top(), "worker_id", []byte{0xd9, 0x01, 'x'})...),
		mpMap(mpWith(top(), "worker_id", mpStr(""))...),
		mpMap(mpWith(top(), "worker_id", mpStr("\xed\xa0\x80"))...), // a surrogate: invalid UTF-8
		mpMap(goldenTop(mpWith(goldenScheduled(), "var_prefill_length", mpF32(0.1)), goldenQueued())...),
		mpMap(goldenTop(mpWith(goldenScheduled(), "var_prefill_length", mpF32(-0.5)), goldenQueued())...),
		mpMap(goldenTop(goldenScheduled(), mpWith(goldenQueued(), "var_decode_kv_tokens", []byte{0x05}))...),
		mpMap(goldenTop(goldenScheduled(), mpWith(goldenQueued(), "num_decode_requests", mpF64(1)))...),
		mpMap(goldenTop(mpWith(goldenScheduled(), "extra", []byte{0xc0}), goldenQueued())...),
		mpMap(goldenTop(goldenScheduled(), append(goldenQueued()[:5], mpKV{"num_prefill_requests", []byte{0x00}}))...),
		mpCat([]byte{0xde, 0x00, 0x07}, goldenPayload()[1:]), // map16 header
	)
	return seeds
}

// jsonSeeds returns FPM bodies: the canonical JSON of the msgpack seeds that decode, the unit tests'
// bodies, and variations of the golden body.
func jsonSeeds(tb testing.TB) [][]byte {
	var seeds [][]byte
	for _, p := range msgpackSeeds() {
		if f, err := decodeFPMSlow(p); err == nil {
			seeds = append(seeds, f.JSON)
		}
	}
	sub := func(old, new string) []byte {
		if !strings.Contains(goldenJSON, old) {
			tb.Fatalf("golden JSON has no %s", old)
		}
		return []byte(strings.Replace(goldenJSON, old, new, 1))
	}
	seeds = append(seeds,
		[]byte(goldenJSON), []byte(goldenJSON+" \n"), []byte(" "+goldenJSON), []byte("{}"), []byte(""),
		[]byte("\x87\xa7version"), []byte(`[1,2]`), []byte(goldenJSON[:len(goldenJSON)-10]), []byte(goldenJSON+`{}`),
		sub(`"var_decode_kv_tokens":0.0}}`, `"var_decode_kv_tokens":0.0,}}`),
		sub(`"dp_rank":0,`, `"dp_rank":0,"dp_rank":1,`),
		sub(`"wall_time":0.025`, `"wall_time":NaN`),
		sub(`"counter_id":42`, `"counter_id":042`),
		sub(`"wall_time":0.025`, `"wall_time":1e400`),
		sub(`"wall_time":0.025`, `"wall_time":1e-400`),
		sub(`"wall_time":0.025`, `"wall_time":2.5E-2`),
		sub(`"wall_time":0.025`, `"wall_time":0.1234567890123456789`),
		sub(`"wall_time":0.025`, `"wall_time":12345678901234567890`),
		sub(`"wall_time":0.025`, `"wall_time":9223372036854775807`),
		sub(`"wall_time":0.025`, `"wall_time":-0.0`),
		sub(`"wall_time":0.025`, `"wall_time":0`),
		sub(`"wall_time":0.025`, `"wall_time":0.0000000000000000000000001`),
		sub(`"4192"`, `"\ud800x"`),
		sub(`"4192"`, "\"41\n92\""),
		sub(`"4192"`, "\"41\xff92\""),
		sub(`"4192"`, "\"41\x7fé😀92\""),
		sub(`"4192"`, `"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00<"`),
		[]byte(`{"x":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)+`}`),
		sub(`"version":1`, `"version":2`),
		sub(`"version":1`, `"version":1.0`),
		sub(`"version":1`, `"versio\u006e":1`),
		sub(`"num_decode_requests":3`, `"num_decode_requests":3.0`),
		sub(`"num_decode_requests":3`, `"num_decode_requests":-0`),
		sub(`"num_decode_requests":3`, `"num_decode_requests":-3`),
		sub(`"num_decode_requests":3`, `"num_decode_requests":3e0`),
		sub(`"counter_id":42`, `"counter_id":9223372036854775807`),
		sub(`"counter_id":42`, `"counter_id":9223372036854775808`),
		sub(`"counter_id":42`, `"counter_id":123456789012345678901234567890`),
		sub(`"wall_time":0.025`, `"wall_time":null`),
		sub(`"var_prefill_length":12.5`, `"var_prefill_length":-1e-9`),
		sub(`"sum_prefill_kv_tokens":64,`, ``),
		sub(`"4192"`, `4192`),
		sub(`"dp_rank":0,`, `"dp_rank":0, `),
		sub(`"dp_rank":0,`, `"dp_rank":0,"extra":[1,{"a":null}],`),
	)
	return seeds
}

func TestDecodeFPMFastMatchesReferenceOnSeeds(t *testing.T) {
	var dec Decoder
	for _, p := range msgpackSeeds() {
		checkDecodeFPMMatchesReference(t, &dec, p)
	}
	// The fast path is not dead: the shapes the publisher sends take it.
	var fpm FPM
	for name, p := range map[string][]byte{"golden": goldenPayload(), "heartbeat": heartbeatPayload(), "encoder": EncodeMsgpack(&goldenFPM)} {
		if _, _, ok := appendFPMMsgpackFast(nil, p, &fpm); !ok {
			t.Errorf("%s payload does not take the fast path", name)
		}
	}
	// Dynamo's own payloads (serde_json reference rows): fast and general paths agree on them too.
	for _, row := range readSerdeTSV(t, "fpm.tsv") {
		payload, err := hex.DecodeString(row[0])
		if err != nil {
			t.Fatal(err)
		}
		checkDecodeFPMMatchesReference(t, &dec, payload)
	}
}

func TestParseFPMJSONFastMatchesReferenceOnSeeds(t *testing.T) {
	var dec Decoder
	for _, b := range jsonSeeds(t) {
		checkParseFPMJSONMatchesReference(t, &dec, b)
	}
	var fpm FPM
	for name, p := range map[string][]byte{"golden": goldenPayload(), "heartbeat": heartbeatPayload()} {
		f, err := DecodeFPM(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := parseFPMJSONFast(f.JSON, &fpm); !ok {
			t.Errorf("canonical JSON of the %s payload does not take the fast path", name)
		}
	}
}

// The hot-path API allocates what its documentation says.
func TestDecoderAllocations(t *testing.T) {
	payload := goldenPayload()
	body := []byte(goldenJSON)
	var dec Decoder
	var f FPM
	if n := testing.AllocsPerRun(100, func() {
		if err := dec.DecodeFPM(payload, &f); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Errorf("Decoder.DecodeFPM: %v allocations, want 1 (the JSON)", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := dec.ParseFPMJSON(body, &f); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Decoder.ParseFPMJSON: %v allocations, want 0", n)
	}
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() {
		var err error
		if buf, err = appendDecodeFPM(buf[:0], payload, &f); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AppendDecodeFPM: %v allocations, want 0", n)
	}
	if string(f.JSON) != goldenJSON || f.WorkerID != "4192" {
		t.Errorf("AppendDecodeFPM: got %s %q", f.JSON, f.WorkerID)
	}
}

// A Decoder reuses the last worker_id only while it is unchanged.
func TestDecoderWorkerIDCache(t *testing.T) {
	var dec Decoder
	var a, b, c FPM
	other := mpMap(mpWith(goldenTop(goldenScheduled(), goldenQueued()), "worker_id", mpStr("4193"))...)
	for _, step := range []struct {
		payload []byte
		f       *FPM
		want    string
	}{{goldenPayload(), &a, "4192"}, {other, &b, "4193"}, {goldenPayload(), &c, "4192"}} {
		if err := dec.DecodeFPM(step.payload, step.f); err != nil {
			t.Fatal(err)
		}
		if step.f.WorkerID != step.want {
			t.Fatalf("WorkerID %q, want %q", step.f.WorkerID, step.want)
		}
	}
	// Results are independent: the JSON of one decode is not overwritten by the next.
	if !bytes.Contains(a.JSON, []byte(`"4192"`)) || !bytes.Contains(b.JSON, []byte(`"4193"`)) {
		t.Errorf("JSON of earlier results changed: %s / %s", a.JSON, b.JSON)
	}
}

func TestAppendDecodeFPMErrorKeepsDst(t *testing.T) {
	dst := []byte("abc")
	f := goldenFPM
	out, err := appendDecodeFPM(dst, []byte{0x80}, &f)
	var ve *validationError
	if !errors.As(err, &ve) || ve.Field != "version" || ve.Reason != "missing" {
		t.Fatalf("error %v", err)
	}
	if string(out) != "abc" || exact(&f) != exact(&goldenFPM) {
		t.Errorf("dst or f changed on error: %q %+v", out, f)
	}
}

// unknownPayload is the golden payload with one unknown top-level field, which the fast path leaves to
// the general path.
func unknownPayload() []byte {
	return mpMap(append(goldenTop(goldenScheduled(), goldenQueued()), mpKV{"extra", []byte{0x01}})...)
}

func BenchmarkDecodeFPMReference(b *testing.B) {
	payload := goldenPayload()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeFPMSlow(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecoderDecodeFPM(b *testing.B) {
	payload := goldenPayload()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	var dec Decoder
	var f FPM
	for b.Loop() {
		if err := dec.DecodeFPM(payload, &f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendDecodeFPM(b *testing.B) {
	payload := goldenPayload()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	var f FPM
	buf := make([]byte, 0, 1024)
	for b.Loop() {
		var err error
		if buf, err = appendDecodeFPM(buf[:0], payload, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// The general path, through DecodeFPM (unknown field) and as the reference: the fallback costs one
// failed fast attempt.
func BenchmarkDecodeFPMFallback(b *testing.B) {
	payload := unknownPayload()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeFPM(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeFPMFallbackReference(b *testing.B) {
	payload := unknownPayload()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeFPMSlow(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseFPMJSONReference(b *testing.B) {
	body := []byte(goldenJSON)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseFPMJSONSlow(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecoderParseFPMJSON(b *testing.B) {
	body := []byte(goldenJSON)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var dec Decoder
	var f FPM
	for b.Loop() {
		if err := dec.ParseFPMJSON(body, &f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendJSONFloat(b *testing.B) {
	values := []float64{0.025, 12.5, 1234.5678, 3.0, 1e-7, 0.1}
	buf := make([]byte, 0, 64)
	for b.Loop() {
		for _, v := range values {
			buf = appendJSONFloat(buf[:0], v)
		}
	}
}

// The fuzzers mutate bytes; this walks the value space the fast paths convert: random counts of every
// width and random non-negative floats (bit patterns, short decimals, integral values), as msgpack and
// as JSON written in several number forms, fields in random order, fast path against reference.
func TestFastPathsRandomValues(t *testing.T) {
	x := uint64(0x2545F4914F6CDD1D)
	next := func() uint64 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return x
	}
	count := func() []byte {
		switch next() % 4 {
		case 0:
			return []byte{byte(next() % 128)}
		case 1:
			return mpUintN(next()>>(1+next()%63), 0xcc+byte(next()%4))
		case 2:
			m := 0xd0 + byte(next()%4)
			return mpUintN(next()>>(next()%64)&(1<<(8<<(m-0xd0)-1)-1), m) // non-negative as a signed int
		}
		return []byte{0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, byte(next())}
	}
	float := func() float64 {
		switch next() % 5 {
		case 0:
			if v := math.Float64frombits(next() &^ (1 << 63)); v <= math.MaxFloat64 {
				return v
			}
			return 0
		case 1:
			return float64(next()%100000) / math.Pow(10, float64(next()%8))
		case 2:
			return float64(next() % (1 << 53))
		case 3:
			return math.Float64frombits(next() % (1 << 52)) // subnormal
		}
		return float64(next()%1000) * math.Pow(10, float64(int(next()%40)-20))
	}
	number := func() []byte {
		switch next() % 4 {
		case 0:
			if v := float32(float()); v <= math.MaxFloat32 {
				return mpF32(v)
			}
			return mpF32(1.5)
		case 1:
			return count()
		}
		return mpF64(float())
	}
	shuffle := func(kv []mpKV) []mpKV {
		out := append([]mpKV(nil), kv...)
		if next()%2 == 0 {
			for i := len(out) - 1; i > 0; i-- {
				j := int(next() % uint64(i+1))
				out[i], out[j] = out[j], out[i]
			}
		}
		return out
	}
	var dec Decoder
	fastMp, fastJSON := 0, 0
	const n = 2000
	for range n {
		sched := goldenScheduled()
		for i := range sched {
			if sched[i].k[:3] == "var" {
				sched[i].v = number()
			} else {
				sched[i].v = count()
			}
		}
		queued := goldenQueued()
		for i := range queued {
			if queued[i].k[:3] == "var" {
				queued[i].v = number()
			} else {
				queued[i].v = count()
			}
		}
		top := goldenTop(shuffle(sched), shuffle(queued))
		top = mpWith(top, "dp_rank", count())
		top = mpWith(top, "counter_id", count())
		top = mpWith(top, "wall_time", number())
		payload := mpMap(shuffle(top)...)
		if checkDecodeFPMMatchesReference(t, &dec, payload) {
			fastMp++
		}
		f, err := decodeFPMSlow(payload)
		if err != nil {
			t.Fatal(err)
		}
		if checkParseFPMJSONMatchesReference(t, &dec, f.JSON) {
			fastJSON++
		}
		// The same body with the numbers of the float fields written in other JSON forms.
		for _, form := range []string{"%g", "%e", "%.17g", "%.3f", "%E", "%.0f"} {
			v := float()
			s := fmt.Sprintf(form, v)
			if !strings.ContainsAny(s, ".eE") && len(s) > 19 {
				continue // not JSON for a float field beyond int64: covered by the seeds
			}
			checkParseFPMJSONMatchesReference(t, &dec, jsonWithWallTime(f.JSON, s))
		}
	}
	t.Logf("fast paths taken %d (msgpack) and %d (JSON) times of %d", fastMp, fastJSON, n)
	if fastMp < n*9/10 || fastJSON < n*9/10 {
		t.Errorf("fast paths taken %d (msgpack) and %d (JSON) times of %d", fastMp, fastJSON, n)
	}
}

// mpUintN encodes u with the integer marker m (uint8..64 or int8..64), truncating u to its width.
func mpUintN(u uint64, m byte) []byte {
	size := 1 << ((m - 0xcc) & 3)
	b := []byte{m}
	for i := size - 1; i >= 0; i-- {
		b = append(b, byte(u>>(8*i)))
	}
	return b
}

// jsonWithWallTime returns body with the value of wall_time replaced by the literal v.
func jsonWithWallTime(body []byte, v string) []byte {
	const key = `"wall_time":`
	i := bytes.Index(body, []byte(key)) + len(key)
	j := i
	for j < len(body) && body[j] != ',' && body[j] != '}' {
		j++
	}
	return append(append(append([]byte(nil), body[:i]...), v...), body[j:]...)
}
