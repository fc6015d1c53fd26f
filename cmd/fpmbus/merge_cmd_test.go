package main

import (
	"errors"
	"flag"
	"io"
	"testing"
)

// --merge-partition I/N is a deprecated alias: it sets the partition count N unless
// --merge-partitions is given, and a malformed value is still a usage error naming it.
func TestMergeDeprecatedPartitionFlag(t *testing.T) {
	for name, tc := range map[string]struct {
		prefix string
		args   []string
		want   int
		err    bool
	}{
		"default":                         {args: nil, want: 1},
		"partitions":                      {args: []string{"--merge-partitions", "4"}, want: 4},
		"deprecated I/N sets N":           {args: []string{"--merge-partition", "1/3"}, want: 3},
		"explicit partitions win":         {args: []string{"--merge-partitions", "2", "--merge-partition", "1/3"}, want: 2},
		"deprecated in up":                {prefix: mergePrefix, args: []string{"--merge-partition", "0/5"}, want: 5},
		"malformed deprecated value":      {args: []string{"--merge-partition", "x"}, err: true},
		"index out of range":              {args: []string{"--merge-partition", "3/3"}, err: true},
		"zero partitions":                 {args: []string{"--merge-partitions", "0"}, err: true},
		"pinned ttl below the minimum":    {args: []string{"--merge-pinned-ttl", "1s"}, err: true},
		"member id is an option, not cfg": {args: []string{"--merge-member-id", "m7"}, want: 1},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("merge", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o := mergeFlags(fs, tc.prefix)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := o.config()
			switch {
			case tc.err && !errors.Is(err, errUsage):
				t.Fatalf("got %v, want a usage error", err)
			case !tc.err && err != nil:
				t.Fatal(err)
			case !tc.err && cfg.Partitions != tc.want:
				t.Fatalf("partitions %d, want %d", cfg.Partitions, tc.want)
			}
		})
	}
}
