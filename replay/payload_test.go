package replay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

const (
	scheduledZero = `{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,"sum_prefill_kv_tokens":0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0}`
	queuedZero    = `{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0}`
)

// fpmObj is an FPM JSON object with the required fields and extra ones appended.
func fpmObj(worker string, counter int64, wall, extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"version":1,"worker_id":` + strconv.Quote(worker) + `,"dp_rank":1,"counter_id":` + strconv.FormatInt(counter, 10) +
		`,"wall_time":` + wall + `,"scheduled_requests":` + scheduledZero + `,"queued_requests":` + queuedZero + extra + `}`
}

// msgpackWith returns a msgpack FPM whose top-level map has one more field, name, with the raw msgpack
// value v: for value types JSON cannot write (float32, bin, ext).
func msgpackWith(name string, v []byte) []byte {
	f := schemas.FPM{Version: 1, WorkerID: "w", CounterID: 7}
	p := schemas.EncodeMsgpack(&f)
	p[0]++ // fixmap of 7 -> 8 fields
	p = schemas.AppendMsgpackStr(p, name)
	return append(p, v...)
}

// Every recorded fpm becomes a payload that decodes back to exactly the recorded bytes, whatever it
// holds: what Dynamo's publisher sends, unknown fields at any depth, every msgpack type a worker could
// have sent.
func TestPayloadDecodesToTheRecordedBytes(t *testing.T) {
	f32 := make([]byte, 5)
	f32[0] = 0xca
	binary.BigEndian.PutUint32(f32[1:], math.Float32bits(0.1))
	cases := map[string][]byte{
		"a synthetic engine FPM":                 fpmJSON(t, "worker-1", 3, 12345),
		"an idle heartbeat":                      canonicalOf(t, fpmObj("w", 9, "0.0", "")),
		"wall_time sent as the integer 0":        canonicalOf(t, fpmObj("w", 9, "0", "")),
		"the empty worker_id (Dynamo's default)": canonicalOf(t, fpmObj("", 0, "0.5", "")),
		"unknown fields at every depth": canonicalOf(t, fpmObj("w", 1, "0.25",
			`"extra":{"a":[1,-2,3.5,null,true,false,"s\n\"\u00e9\u2028\\"],"b":{}},"e":[],"big":18446744073709551615,"min":-9223372036854775808,"neg":-33,"n16":-200,"n32":-70000,"n64":-5000000000`)),
		"floats as serde_json writes them": canonicalOf(t, fpmObj("w", 1, "1e16",
			`"f":[0.1,1.5e-7,1.7976931348623157e308,-0.0,100.0,0.000123,5e-324]`)),
		"integer widths":              canonicalOf(t, fpmObj("w", 4294967296, "0.5", `"u":[127,128,255,256,65535,65536,4294967295]`)),
		"long strings":                canonicalOf(t, fpmObj(strings.Repeat("w", 40), 1, "0.5", `"s8":"`+strings.Repeat("x", 200)+`","s16":"`+strings.Repeat("y", 300)+`","s32":"`+strings.Repeat("z", 70000)+`"`)),
		"wide containers":             canonicalOf(t, fpmObj("w", 1, "0.5", `"arr":[`+strings.Repeat("1,", 20)+`1],"obj":{`+wideObject(40)+`}`)),
		"a float32 (widened exactly)": canonical(t, msgpackWith("f32", f32)),
		"bin and ext values":          canonical(t, msgpackWith("bin", []byte{0xc4, 3, 0, 1, 255})),
		"an ext value":                canonical(t, msgpackWith("ext", []byte{0xd4, 5, 42})),
	}
	var dec schemas.Decoder
	for name, fpm := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := encodePayload(nil, fpm, "", &dec)
			if err != nil {
				t.Fatalf("encode %s: %v", fpm, err)
			}
			if got := canonical(t, p.bytes); !bytes.Equal(got, fpm) {
				t.Fatalf("decodes to\n%s\nwant\n%s", got, fpm)
			}
		})
	}
	// The common shape is encoded exactly as msgspec (Dynamo's publisher) encodes it.
	f, err := schemas.ParseFPMJSON(cases["a synthetic engine FPM"])
	if err != nil {
		t.Fatal(err)
	}
	p, err := encodePayload(nil, f.JSON, "", &dec)
	if err != nil {
		t.Fatal(err)
	}
	if want := schemas.EncodeMsgpack(f); !bytes.Equal(p.bytes, want) {
		t.Fatalf("payload\n%x\nis not msgspec's\n%x", p.bytes, want)
	}
}

func wideObject(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i))
	}
	return b.String()
}

// A trace Dynamo wrote before its serde_json formatted floats with zmij prints positive exponents
// without a sign ("1e16"). It replays: the payload holds the same float bits, which decode to today's
// rendering ("1e+16"); nothing else may differ.
func TestPayloadAcceptsRyuExponents(t *testing.T) {
	var dec schemas.Decoder
	recorded := fpmObj("w", 1, "1e16", `"f":[1.5e17,1.7976931348623157e308,1.5e-7,5e-324],"s":"1e16"`)
	p, err := encodePayload(nil, []byte(recorded), "", &dec)
	if err != nil {
		t.Fatal(err)
	}
	want := fpmObj("w", 1, "1e+16", `"f":[1.5e+17,1.7976931348623157e+308,1.5e-7,5e-324],"s":"1e16"`)
	if got := canonical(t, p.bytes); string(got) != want {
		t.Fatalf("decodes to\n%s\nwant\n%s", got, want)
	}
}

// The two rewrites touch only what they say: worker_id through the map, counter_id set to the
// sequence; everything else decodes to the recorded bytes.
func TestPayloadRewritesWorkerAndCounter(t *testing.T) {
	rec := canonicalOf(t, fpmObj("old", 77, "0.5", `"nested":{"worker_id":"old","counter_id":77}`))
	var dec schemas.Decoder
	cases := map[string]struct {
		worker   string
		renumber bool
		counter  uint64
		want     []byte
	}{
		"kept as recorded":        {want: rec},
		"counter renumbered":      {renumber: true, counter: 100000, want: canonicalOf(t, fpmObj("old", 100000, "0.5", `"nested":{"worker_id":"old","counter_id":77}`))},
		"counter renumbered to 0": {renumber: true, counter: 0, want: canonicalOf(t, fpmObj("old", 0, "0.5", `"nested":{"worker_id":"old","counter_id":77}`))},
		"worker mapped":           {worker: "new-worker", want: canonicalOf(t, fpmObj("new-worker", 77, "0.5", `"nested":{"worker_id":"old","counter_id":77}`))},
		"worker mapped and counter renumbered": {worker: "n", renumber: true, counter: 1 << 40,
			want: canonicalOf(t, fpmObj("n", 1<<40, "0.5", `"nested":{"worker_id":"old","counter_id":77}`))},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := encodePayload(nil, rec, c.worker, &dec)
			if err != nil {
				t.Fatal(err)
			}
			if got := canonical(t, p.build(nil, c.renumber, c.counter)); !bytes.Equal(got, c.want) {
				t.Fatalf("decodes to\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// What cannot decode back to the recorded bytes is refused with its reason, never sent altered.
func TestPayloadRefusesWhatCannotRoundTrip(t *testing.T) {
	var dec schemas.Decoder
	cases := map[string]struct {
		fpm  string
		want error
	}{
		"an integer beyond 64 bits":         {fpmObj("w", 1, "0.5", `"huge":123456789012345678901234567890`), errUnencodable},
		"an exponent written 1E5":           {fpmObj("w", 1, "1E5", ""), errNotCanonical},
		"a '+' on a small exponent":         {fpmObj("w", 1, "1.5e+7", ""), errNotCanonical},
		"a negative exponent's '-' dropped": {fpmObj("w", 1, "0.5", `"f":1.5e7`), errNotCanonical},
		"a float with a trailing 0":         {fpmObj("w", 1, "0.50", ""), errNotCanonical},
		"whitespace":                        {strings.Replace(fpmObj("w", 1, "0.5", ""), `"version":1`, `"version": 1`, 1), errNotCanonical},
		"an escaped slash":                  {fpmObj("w", 1, "0.5", `"s":"a\/b"`), errNotCanonical},
		"not an FPM at all":                 {`{"a":1}`, errNotCanonical},
		"not JSON":                          {`{"version":1,`, errNotCanonical},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := encodePayload(nil, []byte(c.fpm), "", &dec)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}
