package zmqflags

import (
	"flag"
	"io"
	"testing"
)

// portBlock is a command line of --x-fpm-port and --x-dp-size, where the base port's default came
// from, and the error CheckPorts gives ("" for none).
type portBlock struct {
	source string
	args   []string
	want   string
}

// CheckPorts blames what the user chose, in the order --dp-size, --fpm-port, the default's source.
func TestCheckPortsBlamesWhatTheUserChose(t *testing.T) {
	for name, tc := range map[string]portBlock{
		"defaults fit":            {want: ""},
		"highest block that fits": {args: []string{"-x-fpm-port", "65534", "-x-dp-size", "2"}, want: ""},
		"no ranks":                {args: []string{"-x-dp-size", "0"}, want: "--x-dp-size 0: want at least 1"},
		"dp size overflows":       {args: []string{"-x-fpm-port", "65535", "-x-dp-size", "2"}, want: "--x-dp-size 2: the last rank's port 65536 exceeds 65535 (base port 65535, from --x-fpm-port)"},
		"given port overflows":    {source: "ENV_PORT", args: []string{"-x-fpm-port", "0"}, want: "--x-fpm-port 0: want a port, 1 to 65535"},
		"source's port":           {source: "ENV_PORT", args: nil, want: "ENV_PORT 65535 with 2 ranks: the last rank's port 65536 exceeds 65535"},
		"package default's port":  {args: nil, want: "the default base port 65535 with 2 ranks: the last rank's port 65536 exceeds 65535"},
	} {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			base, dp := 20380, 1
			if tc.args == nil && tc.want != "" {
				base, dp = 65535, 2 // the defaults themselves overflow
			}
			s := On(fs, "x-")
			s.RegisterPorts(&base, &dp, "binds")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := s.CheckPorts(base, dp, tc.source)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckPorts(%d, %d) = %v, want nil", base, dp, err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("CheckPorts(%d, %d) = %v, want %q", base, dp, err, tc.want)
			}
		})
	}
}
