package schemas

import (
	"bytes"
	"encoding/hex"
	"math"
	"strings"
	"testing"
)

func TestEncodeMsgpackGolden(t *testing.T) {
	tests := map[string]struct {
		f    FPM
		want []byte
	}{
		"seed example": {goldenFPM, goldenPayload()},
		"heartbeat": {
			FPM{Version: 1, WorkerID: "worker-7", DPRank: 3, CounterID: 5000},
			heartbeatPayload(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := EncodeMsgpack(&tc.f)
			if !bytes.Equal(got, tc.want) {
				t.Errorf("EncodeMsgpack\n got %s\nwant %s", hex.EncodeToString(got), hex.EncodeToString(tc.want))
			}
			if app := AppendMsgpack([]byte{0xee}, &tc.f); !bytes.Equal(app, append([]byte{0xee}, tc.want...)) {
				t.Errorf("AppendMsgpack does not append the same bytes")
			}
			back, err := DecodeFPM(got)
			if err != nil {
				t.Fatalf("DecodeFPM(EncodeMsgpack): %v", err)
			}
			if typedFields(back) != typedFields(&tc.f) {
				t.Errorf("round trip\n got %+v\nwant %+v", typedFields(back), typedFields(&tc.f))
			}
		})
	}
}

// msgspec's integer encoding: the smallest of positive fixint, uint8..64 for non-negative values, and
// negative fixint, int8..64 for negative ones.
func TestAppendMsgpackInt(t *testing.T) {
	tests := map[string]struct {
		in   int64
		want string // hex
	}{
		"zero":                {0, "00"},
		"largest fixint":      {127, "7f"},
		"uint8 from 128":      {128, "cc80"},
		"largest uint8":       {255, "ccff"},
		"uint16":              {256, "cd0100"},
		"largest uint16":      {65535, "cdffff"},
		"uint32":              {65536, "ce00010000"},
		"largest uint32":      {math.MaxUint32, "ceffffffff"},
		"uint64":              {math.MaxUint32 + 1, "cf0000000100000000"},
		"largest int64":       {math.MaxInt64, "cf7fffffffffffffff"},
		"minus one":           {-1, "ff"},
		"smallest neg fixint": {-32, "e0"},
		"int8":                {-33, "d0df"},
		"smallest int8":       {-128, "d080"},
		"int16":               {-129, "d1ff7f"},
		"smallest int16":      {-32768, "d18000"},
		"int32":               {-32769, "d2ffff7fff"},
		"smallest int32":      {math.MinInt32, "d280000000"},
		"int64":               {math.MinInt32 - 1, "d3ffffffff7fffffff"},
		"smallest int64":      {math.MinInt64, "d38000000000000000"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := hex.EncodeToString(AppendMsgpackInt(nil, tc.in)); got != tc.want {
				t.Errorf("AppendMsgpackInt(%d) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestAppendMsgpackStr(t *testing.T) {
	tests := map[string]struct {
		n      int
		header string // hex
	}{
		"empty fixstr":   {0, "a0"},
		"longest fixstr": {31, "bf"},
		"str8":           {32, "d920"},
		"longest str8":   {255, "d9ff"},
		"str16":          {256, "da0100"},
		"longest str16":  {65535, "daffff"},
		"str32":          {65536, "db00010000"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := strings.Repeat("w", tc.n)
			got := AppendMsgpackStr(nil, s)
			if h := hex.EncodeToString(got[:len(got)-tc.n]); h != tc.header {
				t.Errorf("header = %s, want %s", h, tc.header)
			}
			if !bytes.Equal(got, mpStr(s)) {
				t.Errorf("differs from the hand-built encoding")
			}
			// A payload with this worker_id decodes back to it.
			f := goldenFPM
			f.WorkerID = s
			back, err := DecodeFPM(EncodeMsgpack(&f))
			if err != nil || back.WorkerID != s {
				t.Errorf("round trip of a %d-byte worker_id failed: %v", tc.n, err)
			}
		})
	}
}

func TestEncodeMsgpackFloatsAlwaysFloat64(t *testing.T) {
	f := goldenFPM
	f.WallTime = 2 // integral: msgspec still writes float64
	got := EncodeMsgpack(&f)
	want := mpCat([]byte{0xa9}, []byte("wall_time"), mpF64(2))
	if !bytes.Contains(got, want) {
		t.Errorf("wall_time 2.0 not encoded as float64: %s", hex.EncodeToString(got))
	}
}

func BenchmarkAppendMsgpack(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendMsgpack(buf[:0], &goldenFPM)
	}
}
