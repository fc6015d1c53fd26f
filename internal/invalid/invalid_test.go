package invalid

import (
	"errors"
	"io/fs"
	"testing"
)

func TestReporter(t *testing.T) {
	t.Parallel()
	errBad := errors.New("pkg: invalid configuration")
	bad := Reporter(errBad)
	for name, tc := range map[string]struct {
		err  error
		want string
		also error
	}{
		"what is wrong, after the sentinel": {err: bad("batch %d: want at least 1", 0), want: "pkg: invalid configuration: batch 0: want at least 1"},
		"a cause is wrapped too":            {err: bad("output %s: %w", "/x", fs.ErrNotExist), want: "pkg: invalid configuration: output /x: file does not exist", also: fs.ErrNotExist},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if !errors.Is(tc.err, errBad) {
				t.Fatal("the sentinel is not wrapped")
			}
			if tc.also != nil && !errors.Is(tc.err, tc.also) {
				t.Fatalf("%v is not wrapped", tc.also)
			}
		})
	}
}
