package gaps

import (
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

// TestIsHeartbeatMatchesTheFullParse: the shortcut on wall_time gives the answer of a full parse
// (schemas.FPM.IsHeartbeat) for every way of writing the number, and for bodies it cannot read.
func TestIsHeartbeatMatchesTheFullParse(t *testing.T) {
	t.Parallel()
	const counts = `"scheduled_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,"sum_prefill_kv_tokens":0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0},"queued_requests":{"num_prefill_requests":0,"sum_prefill_tokens":0,"var_prefill_length":0.0,"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0}`
	body := func(wall string) string {
		return `{"version":1,"worker_id":"w","dp_rank":0,"counter_id":3,"wall_time":` + wall + `,` + counts + `}`
	}
	busyCounts := strings.Replace(body("0.0"), `"num_decode_requests":0`, `"num_decode_requests":3`, 1)
	for name, tc := range map[string]struct {
		body string
		want bool
	}{
		"busy":                        {body("0.025"), false},
		"busy, integer":               {body("2"), false},
		"busy, negative":              {body("-0.5"), false},
		"busy, exponent":              {body("2.5e-2"), false},
		"busy, blanks":                {body(" 0.025 "), false},
		"busy, long decimal":          {body("0.0000000000000000000001"), false},
		"heartbeat":                   {body("0.0"), true},
		"heartbeat, integer zero":     {body("0"), true},
		"heartbeat, negative zero":    {body("-0.0"), true},
		"heartbeat, zero exponent":    {body("0e5"), true},
		"zero wall time, busy counts": {busyCounts, false},
		"key in a value":              {strings.Replace(body("0.0"), `"worker_id":"w"`, `"worker_id":"wall_time\":5"`, 1), true},
		"not JSON":                    {`{"wall_time":0.0`, false},
		"no wall time":                {`{"version":1}`, false},
	} {
		t.Run(name, func(t *testing.T) {
			f, err := schemas.ParseFPMJSON([]byte(tc.body))
			full := err == nil && f.IsHeartbeat()
			if full != tc.want {
				t.Fatalf("full parse says heartbeat=%v (err %v), the table %v: fix the table", full, err, tc.want)
			}
			if got := isHeartbeat([]byte(tc.body)); got != tc.want {
				t.Fatalf("isHeartbeat = %v, want %v", got, tc.want)
			}
		})
	}
}
