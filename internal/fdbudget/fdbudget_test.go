package fdbudget

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// The budget counts the descriptors open, the ones asked for and the reserve against the soft limit,
// and tells how far to raise it: the soft limit alone when the hard one allows, else both.
func TestCheck(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		n, open    int
		soft, hard uint64
		want       string // "" for no error
	}{
		"fits":                  {n: 100, open: 10, soft: 256, hard: 256},
		"fits exactly":          {n: 182, open: 10, soft: 256, hard: 256},
		"nothing asked":         {n: 0, open: 300, soft: 256, hard: 256},
		"one over":              {n: 183, open: 10, soft: 256, hard: 4096, want: "x need 183 file descriptors; 10 are open and 64 are kept in reserve, and the limit (RLIMIT_NOFILE, `ulimit -n`) is 256: raise it to at least 257 (`ulimit -n 257`, or LimitNOFILE=257 in a systemd unit), or open fewer sockets"},
		"beyond the hard limit": {n: 9000, open: 9, soft: 256, hard: 256, want: "raise it and the hard limit (256) to at least 9073 (`ulimit -n 9073` as root"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := check("x", tc.n, tc.open, tc.soft, tc.hard)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, ErrExceeded) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want ErrExceeded saying %q", err, tc.want)
			}
		})
	}
}

// InUse counts this process's descriptors: one more while a file is open.
func TestInUseCountsOpenDescriptors(t *testing.T) {
	before, err := InUse()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	during, err := InUse()
	f.Close()
	if err != nil || during != before+1 {
		t.Fatalf("open %d before and %d with one more file (%v)", before, during, err)
	}
}
