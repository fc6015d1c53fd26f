package predict

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// Error texts are cut to MaxDetail bytes at a character boundary, saying how much was cut, with no
// line break left to end a header; a query whose decoding fails on a 5,000,000-digit number gets a
// bounded error that still unwraps to the decoder's.
func TestErrorTextsAreBounded(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		in, want string
	}{
		"short, unchanged":     {in: "phase \"x\": unknown", want: "phase \"x\": unknown"},
		"line breaks replaced": {in: "a\r\nb", want: "a  b"},
		"long, cut":            {in: strings.Repeat("9", 5_000_000), want: strings.Repeat("9", 489) + "… (4999511 bytes cut)"},
		"cut between runes":    {in: strings.Repeat("é", 1000), want: strings.Repeat("é", 246) + "… (1508 bytes cut)"},
	} {
		t.Run(name, func(t *testing.T) {
			got := Bounded(tc.in)
			if got != tc.want || len(got) > MaxDetail || !utf8.ValidString(got) {
				t.Fatalf("got %q (%d bytes), want %q", got, len(got), tc.want)
			}
		})
	}
	_, err := DecodeQuery([]byte(`{"key":"cell.x","step":{"num_decode_requests":` + strings.Repeat("5", 5_000_000) + `}}`))
	var typeErr *json.UnmarshalTypeError
	if err == nil || len(err.Error()) > MaxDetail || !strings.HasPrefix(err.Error(), "decode query: json: cannot unmarshal number 555") || !errors.As(err, &typeErr) {
		t.Fatalf("decode error %.200q (%d bytes)", err, len(err.Error()))
	}
	a := InvalidQuery(err)
	if len(a.Refusal.Detail) > MaxDetail {
		t.Fatalf("refusal detail of %d bytes", len(a.Refusal.Detail))
	}
}
