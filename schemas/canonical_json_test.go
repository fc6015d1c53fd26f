package schemas

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"testing"
)

// Expectations are what Rust's serde_json 1.0.150 (zmij::Buffer::format_finite) writes for an f64; the
// cases with a sign in the exponent are where the older serde_json (ryu) wrote none, and those taken
// from zmij's own tests say so.
func TestAppendJSONFloat(t *testing.T) {
	tests := map[string]struct {
		in   float64
		want string
	}{
		"zero":                       {0.0, "0.0"},
		"negative zero":              {math.Copysign(0, -1), "-0.0"},
		"seed wall time":             {0.025, "0.025"},
		"one":                        {1.0, "1.0"},
		"hundred":                    {100.0, "100.0"},
		"1e15 is plain":              {1e15, "1000000000000000.0"},
		"1e16 is scientific":         {1e16, "1e+16"},
		"just below 1e16 is plain":   {9999999999999998, "9999999999999998.0"},
		"1.5e17":                     {1.5e17, "1.5e+17"},
		"1.5e-7":                     {1.5e-7, "1.5e-7"},
		"1e-5 is plain":              {1e-5, "0.00001"},
		"1e-6 is scientific":         {1e-6, "1e-6"},
		"123456.789":                 {123456.789, "123456.789"},
		"smallest subnormal":         {5e-324, "5e-324"},
		"largest float64":            {1.7976931348623157e308, "1.7976931348623157e+308"},
		"largest subnormal":          {2.225073858507201e-308, "2.225073858507201e-308"},
		"zmij: subnormal 1.234e-320": {1.234e-320, "1.234e-320"},
		"zmij: shorter overestimate": {3.439070283483335e+35, "3.439070283483335e+35"},
		"zmij: single overestimate":  {6.079537928711555e+61, "6.079537928711555e+61"},
		"zmij: normal":               {6.62607015e-34, "6.62607015e-34"},
		"negative large":             {-1e100, "-1e+100"},
		"negative":                   {-1.5, "-1.5"},
		"negative scientific":        {-2.5e-10, "-2.5e-10"},
		"0.1":                        {0.1, "0.1"},
		"0.3 shortest":               {0.30000000000000004, "0.30000000000000004"},
		"2^53":                       {9007199254740992, "9007199254740992.0"},
		"17 digits integral":         {12345678901234567, "1.2345678901234568e+16"},
		"16 digits with fraction":    {123456789012345.6, "123456789012345.6"},
		"kk 16 fraction":             {1234567890123456.7, "1234567890123456.8"},
		"1e21":                       {1e21, "1e+21"},
		"1.5e300":                    {1.5e300, "1.5e+300"},
		"0.0001234":                  {0.0001234, "0.0001234"},
		"0.00001234":                 {0.00001234, "0.00001234"},
		"0.000001234":                {0.000001234, "1.234e-6"},
		"float32 0.1 widened":        {float64(float32(0.1)), "0.10000000149011612"},
		"smallest normal":            {2.2250738585072014e-308, "2.2250738585072014e-308"},
		"NaN is null":                {math.NaN(), "null"},
		"+Inf is null":               {math.Inf(1), "null"},
		"-Inf is null":               {math.Inf(-1), "null"},
		"integral with many digits":  {1234567.0, "1234567.0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := string(appendJSONFloat([]byte("x"), tc.in))
			if got != "x"+tc.want {
				t.Errorf("AppendJSONFloat(%v) = %s, want %s", tc.in, got[1:], tc.want)
			}
			if tc.want == "null" {
				return
			}
			back, err := strconv.ParseFloat(tc.want, 64)
			if err != nil || math.Float64bits(back) != math.Float64bits(tc.in) {
				t.Errorf("%s does not round-trip to %v", tc.want, tc.in)
			}
		})
	}
}

// Every float must round-trip through its JSON text, and be valid JSON.
func TestAppendJSONFloatRoundTripsBitPatterns(t *testing.T) {
	x := uint64(0x9E3779B97F4A7C15)
	for i := 0; i < 200000; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		f := math.Float64frombits(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		s := appendJSONFloat(nil, f)
		back, err := strconv.ParseFloat(string(s), 64)
		if err != nil || math.Float64bits(back) != x {
			t.Fatalf("%x: %s does not round-trip", x, s)
		}
		if !json.Valid(s) {
			t.Fatalf("%x: %s is not valid JSON", x, s)
		}
	}
}

func TestAppendJSONString(t *testing.T) {
	tests := map[string]struct {
		in, want string
	}{
		"plain":                        {"worker-1", `"worker-1"`},
		"empty":                        {"", `""`},
		"quote and backslash":          {`a"b\c`, `"a\"b\\c"`},
		"short escapes":                {"\b\f\n\r\t", `"\b\f\n\r\t"`},
		"other controls lowercase hex": {"\x00\x01\x1f", `"\u0000\u0001\u001f"`},
		"no HTML escaping":             {"<a&b>", `"<a&b>"`},
		"DEL and slash kept":           {"\x7f/", "\"\x7f/\""},
		"line separators kept":         {"\u2028\u2029", "\"\u2028\u2029\""},
		"non-ASCII kept":               {"é😀", `"é😀"`},
		"invalid UTF-8 replaced":       {"a\xffb", "\"a\uFFFDb\""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := string(appendJSONString(nil, tc.in)); got != tc.want {
				t.Errorf("AppendJSONString(%q) = %s, want %s", tc.in, got, tc.want)
			}
			// The escaped text decodes back to the input (when the input is valid UTF-8).
			var back string
			if err := json.Unmarshal([]byte(tc.want), &back); err != nil {
				t.Fatalf("not valid JSON: %v", err)
			}
		})
	}
}

// Go's encoding/json and this encoder agree on every string without U+2028/U+2029 (which Go escapes
// and serde_json does not) once HTML escaping is off.
func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for c := 0; c < 0x800; c++ {
		if c == 0x2028 || c == 0x2029 {
			continue
		}
		s := "x" + string(rune(c)) + "y"
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		want := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Errorf("rune %#x: got %s, want %s", c, got, want)
		}
	}
}
