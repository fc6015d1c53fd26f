package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestDecodeFPMGolden(t *testing.T) {
	tests := map[string]struct {
		payload  []byte
		wantJSON string
		want     FPM
		idle     bool
	}{
		"seed example, busy": {
			payload:  goldenPayload(),
			wantJSON: goldenJSON,
			want:     goldenFPM,
		},
		"idle heartbeat": {
			payload: heartbeatPayload(),
			wantJSON: `{"version":1,"worker_id":"worker-7","dp_rank":3,"counter_id":5000,"wall_time":0.0,` +
				`"scheduled_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,` +
				`"sum_prefill_kv_tokens":0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0},` +
				`"queued_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,` +
				`"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0}}`,
			want: FPM{Version: 1, WorkerID: "worker-7", DPRank: 3, CounterID: 5000},
			idle: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := DecodeFPM(tc.payload)
			if err != nil {
				t.Fatalf("DecodeFPM: %v", err)
			}
			if string(f.JSON) != tc.wantJSON {
				t.Errorf("JSON\n got %s\nwant %s", f.JSON, tc.wantJSON)
			}
			if got := typedFields(f); got != typedFields(&tc.want) {
				t.Errorf("typed fields\n got %+v\nwant %+v", got, tc.want)
			}
			if f.IsHeartbeat() != tc.idle {
				t.Errorf("IsHeartbeat = %v, want %v", f.IsHeartbeat(), tc.idle)
			}
			if !json.Valid(f.JSON) {
				t.Errorf("JSON is not valid JSON: %s", f.JSON)
			}
			if err := f.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			// The result must not alias the payload.
			for i := range tc.payload {
				tc.payload[i] = 0
			}
			if string(f.JSON) != tc.wantJSON || f.WorkerID != tc.want.WorkerID {
				t.Errorf("FPM changed when the payload was overwritten")
			}
		})
	}
}

// unknownFieldsPayload carries extra fields of every msgpack type, at the top level and inside the
// request maps, between and after the known ones.
func unknownFieldsPayload() []byte {
	sched := goldenScheduled()
	sched = append(sched[:2], append([]mpKV{{"prefill_extra", mpF32(0.1)}}, sched[2:]...)...)
	sched = append(sched, mpKV{"tags", []byte{0x92, 0xa1, 'a', 0xc0}}) // ["a", nil]
	queued := append(goldenQueued(), mpKV{"big", []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}})
	top := goldenTop(sched, queued)
	extra := []mpKV{
		{"nil", []byte{0xc0}},
		{"yes", []byte{0xc3}},
		{"no", []byte{0xc2}},
		{"neg", []byte{0xd1, 0xfe, 0xd4}}, // int16 -300
		{"negfix", []byte{0xe0}},          // -32
		{"text", mpStr("<a&b> \"q\" \\ \n\t\x01\x7f é \u2028")},
		{"bin", []byte{0xc4, 0x03, 0x00, 0x7f, 0xff}},
		{"ext", []byte{0xd4, 0x05, 0x2a}},                           // fixext1 type 5
		{"ts", []byte{0xc7, 0x02, 0xff, 0x01, 0x02}},                // ext8 type -1, 2 bytes
		{"nan", mpF64(math.NaN())},                                  // non-finite floats become null
		{"inf", mpF32(float32(math.Inf(1)))},                        //
		{"nested", mpMap(mpKV{"k", mpMap(mpKV{"z", mpF64(1e16)})})}, //
		{"empty", []byte{0x80}},
	}
	// Insert half of the extras after worker_id, the rest at the end.
	out := append([]mpKV{}, top[:2]...)
	out = append(out, extra[:5]...)
	out = append(out, top[2:]...)
	out = append(out, extra[5:]...)
	out = append(out, mpKV{"empty_array", []byte{0x90}})
	// map16 header for the top level (more than 15 entries), as msgspec writes a big dict.
	return mpMap(out...)
}

const unknownFieldsJSON = `{"version":1,"worker_id":"4192","nil":null,"yes":true,"no":false,"neg":-300,"negfix":-32,` +
	`"dp_rank":0,"counter_id":42,"wall_time":0.025,` +
	`"scheduled_requests":{"num_prefill_requests":2,"sum_prefill_tokens":256,"prefill_extra":0.10000000149011612,` +
	`"var_prefill_length":12.5,"sum_prefill_kv_tokens":64,"num_decode_requests":3,"sum_decode_kv_tokens":1024,` +
	`"var_decode_kv_tokens":0.0,"tags":["a",null]},` +
	`"queued_requests":{"num_prefill_requests":1,"sum_prefill_tokens":128,"var_prefill_length":0.0,` +
	`"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0,"big":18446744073709551615},` +
	`"text":"<a&b> \"q\" \\ \n\t\u0001` + "\x7f é \u2028" + `","bin":[0,127,255],"ext":[5,[42]],"ts":[-1,[1,2]],` +
	`"nan":null,"inf":null,"nested":{"k":{"z":1e+16}},"empty":{},"empty_array":[]}`

func TestDecodeFPMUnknownFieldsSurviveInOrder(t *testing.T) {
	f, err := DecodeFPM(unknownFieldsPayload())
	if err != nil {
		t.Fatalf("DecodeFPM: %v", err)
	}
	if string(f.JSON) != unknownFieldsJSON {
		t.Errorf("JSON\n got %s\nwant %s", f.JSON, unknownFieldsJSON)
	}
	if got := typedFields(f); got != typedFields(&goldenFPM) {
		t.Errorf("typed fields\n got %+v\nwant %+v", got, goldenFPM)
	}
	if !json.Valid(f.JSON) {
		t.Errorf("not valid JSON: %s", f.JSON)
	}
}

func TestDecodeFPMAcceptedEncodings(t *testing.T) {
	tests := map[string]struct {
		payload  []byte
		want     func(*FPM)
		wantJSON string // a substring the canonical JSON must contain
	}{
		"integer wall_time stays an integer": {
			payload:  mpMap(mpWith(goldenTop(goldenScheduled(), goldenQueued()), "wall_time", []byte{0x00})...),
			want:     func(f *FPM) { f.WallTime = 0 },
			wantJSON: `"wall_time":0,`,
		},
		"negative zero wall_time": {
			payload:  mpMap(mpWith(goldenTop(goldenScheduled(), goldenQueued()), "wall_time", mpF64(math.Copysign(0, -1)))...),
			want:     func(f *FPM) { f.WallTime = 0 },
			wantJSON: `"wall_time":-0.0,`,
		},
		"float32 variance widened to float64": {
			payload:  mpMap(goldenTop(mpWith(goldenScheduled(), "var_prefill_length", mpF32(0.1)), goldenQueued())...),
			want:     func(f *FPM) { f.Scheduled.VarPrefillLength = float64(float32(0.1)) },
			wantJSON: `"var_prefill_length":0.10000000149011612,`,
		},
		"wide encodings of small integers": {
			payload: mpMap(mpWith(mpWith(goldenTop(goldenScheduled(), goldenQueued()),
				"counter_id", []byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 42}),
				"dp_rank", []byte{0xd3, 0, 0, 0, 0, 0, 0, 0, 0})...),
			want:     func(*FPM) {},
			wantJSON: `"dp_rank":0,"counter_id":42,`,
		},
		"largest int64 counter": {
			payload:  mpMap(mpWith(goldenTop(goldenScheduled(), goldenQueued()), "counter_id", []byte{0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})...),
			want:     func(f *FPM) { f.CounterID = math.MaxInt64 },
			wantJSON: `"counter_id":9223372036854775807,`,
		},
		"str8 worker id with escapes": {
			payload:  mpMap(mpWith(goldenTop(goldenScheduled(), goldenQueued()), "worker_id", mpStr(strings.Repeat("w", 40)+"\"/"))...),
			want:     func(f *FPM) { f.WorkerID = strings.Repeat("w", 40) + "\"/" },
			wantJSON: `"worker_id":"` + strings.Repeat("w", 40) + `\"/",`,
		},
		"fields in another order": {
			payload: mpMap(append(goldenTop(goldenScheduled(), goldenQueued())[5:],
				goldenTop(goldenScheduled(), goldenQueued())[:5]...)...),
			want:     func(*FPM) {},
			wantJSON: `{"scheduled_requests":{`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := DecodeFPM(tc.payload)
			if err != nil {
				t.Fatalf("DecodeFPM: %v", err)
			}
			want := goldenFPM
			tc.want(&want)
			if got := typedFields(f); got != typedFields(&want) {
				t.Errorf("typed fields\n got %+v\nwant %+v", got, want)
			}
			if !bytes.Contains(f.JSON, []byte(tc.wantJSON)) {
				t.Errorf("JSON %s does not contain %s", f.JSON, tc.wantJSON)
			}
		})
	}
}

// mpDepthBomb is a map whose "bomb" value nests n single-element arrays.
func mpDepthBomb(n int) []byte {
	b := mpMap(mpKV{"bomb", mpCat(bytes.Repeat([]byte{0x91}, n), []byte{0x00})})
	return b
}

// decodeErrorCase is a payload DecodeFPM must reject.
type decodeErrorCase struct {
	payload []byte
	want    error  // errMalformed or ErrInvalid
	field   string // decodeError.Field or validationError.Field
	offset  int    // decodeError.Offset; -1: not checked
}

// decodeErrorCases is the error table of TestDecodeFPMErrors; the fuzz corpus seeds from it too.
func decodeErrorCases() map[string]decodeErrorCase {
	top := func() []mpKV { return goldenTop(goldenScheduled(), goldenQueued()) }
	golden := goldenPayload()
	bombPath := "bomb" + strings.Repeat("[0]", maxDepth-1)
	return map[string]decodeErrorCase{
		"empty payload":            {nil, errMalformed, "", 0},
		"random bytes":             {[]byte{0x13, 0x37, 0xbe, 0xef}, errMalformed, "", 0},
		"JSON instead of msgpack":  {[]byte(goldenJSON), errMalformed, "", 0},
		"reserved marker":          {[]byte{0xc1, 0x00}, errMalformed, "", 0},
		"top-level array":          {[]byte{0x92, 0x01, 0x02}, errMalformed, "", 0},
		"top-level string":         {mpStr("fpm"), errMalformed, "", 0},
		"truncated payload":        {golden[:len(golden)-5], errMalformed, "queued_requests.var_decode_kv_tokens", len(golden) - 9},
		"truncated map header":     {[]byte{0xde, 0x00}, errMalformed, "", 0},
		"map with missing value":   {[]byte{0x81, 0xa1, 'a'}, errMalformed, "a", 3},
		"trailing bytes":           {mpCat(golden, []byte{0xc0}), errMalformed, "", len(golden)},
		"two top-level maps":       {mpCat(golden, golden), errMalformed, "", len(golden)},
		"depth bomb":               {mpDepthBomb(1000), errMalformed, bombPath, 6 + maxDepth - 1},
		"deep but allowed nesting": {mpDepthBomb(maxDepth - 1), ErrInvalid, "version", -1},
		"huge declared str32 length": {
			mpMap(mpWith(top(), "worker_id", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'a', 'b'})...),
			errMalformed, "worker_id", -1,
		},
		"huge declared bin32 length": {
			mpMap(mpKV{"blob", []byte{0xc6, 0x7f, 0xff, 0xff, 0xff, 0x00}}), errMalformed, "blob", 6,
		},
		"huge declared ext32 length": {
			mpMap(mpKV{"x", []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}}), errMalformed, "x", 3,
		},
		"huge declared array32 count": {
			mpMap(mpKV{"list", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00}}), errMalformed, "list", 6,
		},
		"huge declared map32 count": {[]byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a', 0x00}, errMalformed, "", 0},
		"truncated float64": {
			mpMap(mpKV{"x", []byte{0xcb, 0x3f, 0xf0}}), errMalformed, "x", 3,
		},
		"truncated fixext": {
			mpMap(mpKV{"x", []byte{0xd8, 0x01, 0x02}}), errMalformed, "x", 3,
		},
		"integer map key": {
			mpMap(mpKV{"scheduled_requests", []byte{0x81, 0x01, 0x02}}), errMalformed, "scheduled_requests", 21,
		},
		"duplicate key": {
			mpMap(append(top(), mpKV{"dp_rank", []byte{0x01}})...), errMalformed, "dp_rank", -1,
		},
		"invalid UTF-8 in a string": {
			mpMap(mpWith(top(), "worker_id", []byte{0xa2, 0xff, 0xfe})...), errMalformed, "worker_id", -1,
		},
		"invalid UTF-8 in a key": {
			mpMap(mpKV{"\xff", []byte{0x00}}), errMalformed, "", 1,
		},
		"reserved marker in array": {
			mpMap(mpKV{"arr", []byte{0x92, 0x01, 0xc1}}), errMalformed, "arr[1]", 7,
		},
		"version 2":                  {mpMap(mpWith(top(), "version", []byte{0x02})...), ErrInvalid, "version", -1},
		"version as float":           {mpMap(mpWith(top(), "version", mpF64(1))...), ErrInvalid, "version", -1},
		"negative count":             {mpMap(goldenTop(mpWith(goldenScheduled(), "num_prefill_requests", []byte{0xff}), goldenQueued())...), ErrInvalid, "scheduled_requests.num_prefill_requests", -1},
		"negative dp_rank":           {mpMap(mpWith(top(), "dp_rank", []byte{0xd0, 0x80})...), ErrInvalid, "dp_rank", -1},
		"count beyond int64":         {mpMap(goldenTop(goldenScheduled(), mpWith(goldenQueued(), "sum_decode_kv_tokens", []byte{0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}))...), ErrInvalid, "queued_requests.sum_decode_kv_tokens", -1},
		"float count":                {mpMap(goldenTop(mpWith(goldenScheduled(), "num_decode_requests", mpF64(3)), goldenQueued())...), ErrInvalid, "scheduled_requests.num_decode_requests", -1},
		"NaN wall_time":              {mpMap(mpWith(top(), "wall_time", mpF64(math.NaN()))...), ErrInvalid, "wall_time", -1},
		"negative wall_time":         {mpMap(mpWith(top(), "wall_time", mpF64(-0.5))...), ErrInvalid, "wall_time", -1},
		"+Inf variance":              {mpMap(goldenTop(mpWith(goldenScheduled(), "var_decode_kv_tokens", mpF64(math.Inf(1))), goldenQueued())...), ErrInvalid, "scheduled_requests.var_decode_kv_tokens", -1},
		"float32 NaN variance":       {mpMap(goldenTop(goldenScheduled(), mpWith(goldenQueued(), "var_prefill_length", mpF32(float32(math.NaN()))))...), ErrInvalid, "queued_requests.var_prefill_length", -1},
		"string variance":            {mpMap(goldenTop(goldenScheduled(), mpWith(goldenQueued(), "var_prefill_length", mpStr("0")))...), ErrInvalid, "queued_requests.var_prefill_length", -1},
		"missing top-level field":    {mpMap(mpWithout(top(), "counter_id")...), ErrInvalid, "counter_id", -1},
		"missing version":            {mpMap(mpWithout(top(), "version")...), ErrInvalid, "version", -1},
		"missing nested field":       {mpMap(goldenTop(goldenScheduled(), mpWithout(goldenQueued(), "sum_decode_kv_tokens"))...), ErrInvalid, "queued_requests.sum_decode_kv_tokens", -1},
		"missing sum_prefill_kv":     {mpMap(goldenTop(mpWithout(goldenScheduled(), "sum_prefill_kv_tokens"), goldenQueued())...), ErrInvalid, "scheduled_requests.sum_prefill_kv_tokens", -1},
		"missing request map":        {mpMap(mpWithout(top(), "queued_requests")...), ErrInvalid, "queued_requests", -1},
		"request map is an array":    {mpMap(mpWith(top(), "scheduled_requests", []byte{0x90})...), ErrInvalid, "scheduled_requests", -1},
		"worker_id is an integer":    {mpMap(mpWith(top(), "worker_id", []byte{0xcd, 0x10, 0x60})...), ErrInvalid, "worker_id", -1},
		"worker_id is bin":           {mpMap(mpWith(top(), "worker_id", []byte{0xc4, 0x01, 'x'})...), ErrInvalid, "worker_id", -1},
		"empty map":                  {[]byte{0x80}, ErrInvalid, "version", -1},
		"queued map of another type": {mpMap(mpWith(top(), "queued_requests", []byte{0xc0})...), ErrInvalid, "queued_requests", -1},
	}
}

func TestDecodeFPMErrors(t *testing.T) {
	tests := decodeErrorCases()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := DecodeFPM(tc.payload)
			if err == nil {
				t.Fatalf("DecodeFPM succeeded: %s", f.JSON)
			}
			if f != nil {
				t.Errorf("DecodeFPM returned an FPM with an error")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v does not match %v", err, tc.want)
			}
			other := ErrInvalid
			if tc.want == ErrInvalid {
				other = errMalformed
			}
			if errors.Is(err, other) {
				t.Errorf("error %v also matches %v", err, other)
			}
			switch tc.want {
			case errMalformed:
				var de *decodeError
				if !errors.As(err, &de) {
					t.Fatalf("error %T is not a *DecodeError", err)
				}
				if de.Field != tc.field {
					t.Errorf("Field = %q, want %q (%v)", de.Field, tc.field, err)
				}
				if tc.offset >= 0 && de.Offset != tc.offset {
					t.Errorf("Offset = %d, want %d (%v)", de.Offset, tc.offset, err)
				}
				if de.Format != formatMsgpack {
					t.Errorf("Format = %q", de.Format)
				}
			case ErrInvalid:
				var ve *validationError
				if !errors.As(err, &ve) {
					t.Fatalf("error %T is not a *ValidationError", err)
				}
				if ve.Field != tc.field {
					t.Errorf("Field = %q, want %q (%v)", ve.Field, tc.field, err)
				}
				if ve.Reason == "" {
					t.Errorf("empty Reason")
				}
			}
		})
	}
}

// Reasons are part of the operator-facing contract (dead letters carry them); check a few exactly.
func TestValidationReasons(t *testing.T) {
	top := func() []mpKV { return goldenTop(goldenScheduled(), goldenQueued()) }
	tests := map[string]struct {
		payload []byte
		want    validationError
	}{
		"unsupported version": {mpMap(mpWith(top(), "version", []byte{0x02})...),
			validationError{"version", "unsupported version 2, want 1"}},
		"negative integer": {mpMap(goldenTop(mpWith(goldenScheduled(), "num_prefill_requests", []byte{0xff}), goldenQueued())...),
			validationError{"scheduled_requests.num_prefill_requests", "negative integer -1"}},
		"missing": {mpMap(mpWithout(top(), "counter_id")...),
			validationError{"counter_id", "missing"}},
		"NaN": {mpMap(mpWith(top(), "wall_time", mpF64(math.NaN()))...),
			validationError{"wall_time", "not finite (NaN)"}},
		"+Inf": {mpMap(mpWith(top(), "wall_time", mpF64(math.Inf(1)))...),
			validationError{"wall_time", "not finite (+Inf)"}},
		"negative float": {mpMap(mpWith(top(), "wall_time", mpF64(-0.5))...),
			validationError{"wall_time", "negative number -0.5"}},
		"wrong type": {mpMap(mpWith(top(), "worker_id", []byte{0x07})...),
			validationError{"worker_id", "not a string (got integer)"}},
		"out of range": {mpMap(mpWith(top(), "dp_rank", []byte{0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})...),
			validationError{"dp_rank", "integer 18446744073709551615 out of range (max 9223372036854775807)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeFPM(tc.payload)
			var ve *validationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v is not a *ValidationError", err)
			}
			if *ve != tc.want {
				t.Errorf("got %+v, want %+v", *ve, tc.want)
			}
		})
	}
}

func TestErrorMessages(t *testing.T) {
	// Error() is for people; check its shape once so it stays as documented.
	de := &decodeError{Format: formatMsgpack, Offset: 17, Field: "scheduled_requests.num_prefill_requests", Err: errors.New("truncated str8")}
	if got, want := de.Error(), `schemas: msgpack at byte 17 (field "scheduled_requests.num_prefill_requests"): truncated str8`; got != want {
		t.Errorf("DecodeError.Error() = %s, want %s", got, want)
	}
	ve := &validationError{Field: "scheduled_requests.num_prefill_requests", Reason: "negative integer -1"}
	if got, want := ve.Error(), "schemas: invalid FPM: scheduled_requests.num_prefill_requests: negative integer -1"; got != want {
		t.Errorf("ValidationError.Error() = %s, want %s", got, want)
	}
	if !errors.Is(ve, ErrInvalid) || errors.Unwrap(ve) != ErrInvalid {
		t.Errorf("ValidationError does not wrap ErrInvalid")
	}
}

func TestParseFPMJSONRoundTrip(t *testing.T) {
	tests := map[string][]byte{
		"seed example":   goldenPayload(),
		"heartbeat":      heartbeatPayload(),
		"unknown fields": unknownFieldsPayload(),
		"float32 and integer numbers": mpMap(goldenTop(
			mpWith(goldenScheduled(), "var_prefill_length", mpF32(3.3)),
			mpWith(goldenQueued(), "var_decode_kv_tokens", []byte{0x05}))...),
		"tiny and huge floats": mpMap(goldenTop(
			mpWith(goldenScheduled(), "var_prefill_length", mpF64(5e-324)),
			mpWith(goldenQueued(), "var_decode_kv_tokens", mpF64(math.MaxFloat64)))...),
	}
	for name, payload := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := DecodeFPM(payload)
			if err != nil {
				t.Fatalf("DecodeFPM: %v", err)
			}
			g, err := ParseFPMJSON(f.JSON)
			if err != nil {
				t.Fatalf("ParseFPMJSON: %v", err)
			}
			if typedFields(g) != typedFields(f) {
				t.Errorf("typed fields differ\n json %+v\n msgpack %+v", typedFields(g), typedFields(f))
			}
			if !bytes.Equal(g.JSON, f.JSON) {
				t.Errorf("JSON differs")
			}
			// With whitespace, as a person might write it.
			var indented bytes.Buffer
			if err := json.Indent(&indented, f.JSON, "", "  "); err != nil {
				t.Fatal(err)
			}
			h, err := ParseFPMJSON(indented.Bytes())
			if err != nil {
				t.Fatalf("ParseFPMJSON(indented): %v", err)
			}
			if typedFields(h) != typedFields(f) {
				t.Errorf("typed fields differ for indented JSON")
			}
		})
	}
}

func TestParseFPMJSONErrors(t *testing.T) {
	sub := func(old, new string) []byte {
		if !strings.Contains(goldenJSON, old) {
			t.Fatalf("golden JSON has no %s", old)
		}
		return []byte(strings.Replace(goldenJSON, old, new, 1))
	}
	tests := map[string]struct {
		body  []byte
		want  error
		field string
	}{
		"not JSON":                {[]byte("\x87\xa7version"), errMalformed, ""},
		"empty":                   {[]byte("  "), errMalformed, ""},
		"array":                   {[]byte(`[1,2]`), errMalformed, ""},
		"truncated":               {[]byte(goldenJSON[:len(goldenJSON)-10]), errMalformed, "queued_requests"},
		"trailing data":           {[]byte(goldenJSON + `{}`), errMalformed, ""},
		"trailing comma":          {sub(`"var_decode_kv_tokens":0.0}}`, `"var_decode_kv_tokens":0.0,}}`), errMalformed, "queued_requests"},
		"duplicate key":           {sub(`"dp_rank":0,`, `"dp_rank":0,"dp_rank":1,`), errMalformed, "dp_rank"},
		"NaN literal":             {sub(`"wall_time":0.025`, `"wall_time":NaN`), errMalformed, "wall_time"},
		"leading zero":            {sub(`"counter_id":42`, `"counter_id":042`), errMalformed, ""},
		"number out of range":     {sub(`"wall_time":0.025`, `"wall_time":1e400`), errMalformed, "wall_time"},
		"lone surrogate":          {sub(`"4192"`, `"\ud800x"`), errMalformed, "worker_id"},
		"raw control character":   {sub(`"4192"`, "\"41\n92\""), errMalformed, "worker_id"},
		"invalid UTF-8":           {sub(`"4192"`, "\"41\xff92\""), errMalformed, "worker_id"},
		"depth bomb":              {[]byte(`{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`), errMalformed, "x" + strings.Repeat("[0]", maxDepth-1)},
		"version 2":               {sub(`"version":1`, `"version":2`), ErrInvalid, "version"},
		"version 1.0":             {sub(`"version":1`, `"version":1.0`), ErrInvalid, "version"},
		"count 3.0 is not an int": {sub(`"num_decode_requests":3`, `"num_decode_requests":3.0`), ErrInvalid, "scheduled_requests.num_decode_requests"},
		"count -0 is a float":     {sub(`"num_decode_requests":3`, `"num_decode_requests":-0`), ErrInvalid, "scheduled_requests.num_decode_requests"},
		"negative count":          {sub(`"num_decode_requests":3`, `"num_decode_requests":-3`), ErrInvalid, "scheduled_requests.num_decode_requests"},
		"count beyond int64":      {sub(`"counter_id":42`, `"counter_id":9223372036854775808`), ErrInvalid, "counter_id"},
		"count beyond uint64":     {sub(`"counter_id":42`, `"counter_id":123456789012345678901234567890`), ErrInvalid, "counter_id"},
		"null wall_time":          {sub(`"wall_time":0.025`, `"wall_time":null`), ErrInvalid, "wall_time"},
		"negative variance":       {sub(`"var_prefill_length":12.5`, `"var_prefill_length":-1e-9`), ErrInvalid, "scheduled_requests.var_prefill_length"},
		"missing nested":          {sub(`"sum_prefill_kv_tokens":64,`, ``), ErrInvalid, "scheduled_requests.sum_prefill_kv_tokens"},
		"worker_id number":        {sub(`"4192"`, `4192`), ErrInvalid, "worker_id"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := ParseFPMJSON(tc.body)
			if err == nil {
				t.Fatalf("ParseFPMJSON succeeded: %+v", typedFields(f))
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v does not match %v", err, tc.want)
			}
			var field string
			var de *decodeError
			var ve *validationError
			switch {
			case errors.As(err, &de):
				field = de.Field
				if de.Format != formatJSON {
					t.Errorf("Format = %q, want json", de.Format)
				}
			case errors.As(err, &ve):
				field = ve.Field
			default:
				t.Fatalf("unexpected error type %T", err)
			}
			if field != tc.field {
				t.Errorf("Field = %q, want %q (%v)", field, tc.field, err)
			}
		})
	}
}

func TestParseFPMJSONEscapes(t *testing.T) {
	body := []byte(strings.Replace(goldenJSON, `"4192"`, `"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00<"`, 1))
	f, err := ParseFPMJSON(body)
	if err != nil {
		t.Fatalf("ParseFPMJSON: %v", err)
	}
	if want := "a\"\\/\b\f\n\r\té😀<"; f.WorkerID != want {
		t.Errorf("WorkerID = %q, want %q", f.WorkerID, want)
	}
}

func TestValidateTyped(t *testing.T) {
	tests := map[string]struct {
		mutate func(*FPM)
		field  string // "" = valid
	}{
		"golden":             {func(*FPM) {}, ""},
		"version 0":          {func(f *FPM) { f.Version = 0 }, "version"},
		"negative counter":   {func(f *FPM) { f.CounterID = -1 }, "counter_id"},
		"NaN queued var":     {func(f *FPM) { f.Queued.VarDecodeKVTokens = math.NaN() }, "queued_requests.var_decode_kv_tokens"},
		"negative wall time": {func(f *FPM) { f.WallTime = -1 }, "wall_time"},
		"negative kv tokens": {func(f *FPM) { f.Scheduled.SumPrefillKVTokens = -5 }, "scheduled_requests.sum_prefill_kv_tokens"},
		"invalid UTF-8":      {func(f *FPM) { f.WorkerID = "\xff" }, "worker_id"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := goldenFPM
			tc.mutate(&f)
			err := f.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ve *validationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate error %v is not a *ValidationError", err)
			}
			if ve.Field != tc.field {
				t.Errorf("Field = %q, want %q", ve.Field, tc.field)
			}
		})
	}
}

func BenchmarkDecodeFPM(b *testing.B) {
	payload := goldenPayload()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeFPM(payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseFPMJSON(b *testing.B) {
	body := []byte(goldenJSON)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseFPMJSON(body); err != nil {
			b.Fatal(err)
		}
	}
}
