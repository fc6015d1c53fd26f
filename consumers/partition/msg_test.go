package partition

import (
	"errors"
	"testing"
)

// The group stream's sequence of a partition stream's copy is the second field of the
// Nats-Stream-Source header the server adds while sourcing.
func TestSourceSequence(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		header string
		want   uint64
		err    error
	}{
		"server format":        {header: "FPM 123 fpm.> {{partition(16,1,2,3,4)}}.fpm.> fpm.dynamo.backend.w1.0", want: 123},
		"stream and sequence":  {header: "FPM 7", want: 7},
		"extra blanks":         {header: "  FPM \t 42  x", want: 42},
		"no sequence":          {header: "FPM", err: errNoSourceSequence},
		"no sequence, blanks":  {header: "FPM   ", err: errNoSourceSequence},
		"empty":                {header: "", err: errNoSourceSequence},
		"sequence not a count": {header: "FPM x12 fpm.>"},
		"negative sequence":    {header: "FPM -1 fpm.>"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := sourceSequence(tc.header)
			switch {
			case tc.want != 0:
				if err != nil || got != tc.want {
					t.Fatalf("sourceSequence(%q) = %d, %v; want %d", tc.header, got, err, tc.want)
				}
			case tc.err != nil:
				if !errors.Is(err, tc.err) {
					t.Fatalf("sourceSequence(%q) = %d, %v; want %v", tc.header, got, err, tc.err)
				}
			default:
				if err == nil {
					t.Fatalf("sourceSequence(%q) = %d, want an error", tc.header, got)
				}
			}
		})
	}
}
