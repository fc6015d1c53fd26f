package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/bridge"
)

// `fpmbus up` refuses a bad setting before it starts anything, exit 2, naming the flag at fault.
func TestUpRefusesBadSettingsNamingThem(t *testing.T) {
	t.Setenv(envFPMPort, "") // unset: the default base port
	for name, tc := range map[string]struct {
		args    []string
		want    string
		notWant string
	}{
		"listen is not host:port":           {[]string{"--listen", "nope"}, `--listen "nope"`, ""},
		"dp-size overflows the port range":  {[]string{"--dp-size", "100000"}, "--dp-size 100000", envFPMPort},
		"max-bytes below -1":                {[]string{"--max-bytes", "-5"}, "-max-bytes", ""},
		"restart limit negative":            {[]string{"--restart-limit", "-1"}, "--restart-limit -1", ""},
		"restart window zero":               {[]string{"--restart-window", "0s"}, "--restart-window 0s", ""},
		"alias sets the prefixed flag":      {[]string{"--rank-timeout", "0s"}, "--merge-rank-timeout 0s", ""},
		"bool alias takes no value":         {[]string{"--allow-partial", "--listen", "nope"}, `--listen "nope"`, ""},
		"demo binds ports, not an endpoint": {[]string{"--demo", "--zmq-endpoint", "127.0.0.1:1"}, "--demo binds its own ports", ""},
		"gaps flag carries its prefix":      {[]string{"--gaps-pinned-ttl", "1ms"}, "--gaps-pinned-ttl 1ms", ""},
		"sync is always or a duration":      {[]string{"--sync", "often"}, `-sync: streams: bad sync policy: "often"`, ""},
		"sync interval must be positive":    {[]string{"--sync", "0s"}, "-sync", ""},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := run(t, append([]string{"up", "--data-dir", t.TempDir()}, tc.args...)...)
			if code != 2 || !strings.Contains(out, tc.want) || tc.notWant != "" && strings.Contains(out, tc.notWant) {
				t.Fatalf("exit %d, want 2 naming %q (and not %q):\n%s", code, tc.want, tc.notWant, out)
			}
		})
	}
}

// In `up` every consumer flag carries its component prefix, and the standalone name it had in `up`
// before stays as a deprecated alias unless an unprefixed flag owns it (the bridge's).
func TestUpFlagNamesFollowThePrefixRule(t *testing.T) {
	up := flag.NewFlagSet("up", flag.ContinueOnError)
	up.SetOutput(io.Discard)
	upFlags(up)
	bridgeOwn := flag.NewFlagSet("bridge", flag.ContinueOnError)
	(&bridge.Config{}).RegisterFlags(bridgeOwn, "")
	for prefix, register := range map[string]func(fs *flag.FlagSet){
		tracePrefix: func(fs *flag.FlagSet) { traceFlags(fs, "") },
		gapsPrefix:  func(fs *flag.FlagSet) { gapsFlags(fs, "") },
		mergePrefix: func(fs *flag.FlagSet) { mergeFlags(fs, "") },
		sealPrefix:  func(fs *flag.FlagSet) { sealFlags(fs, "") },
	} {
		standalone := flag.NewFlagSet(prefix, flag.ContinueOnError)
		register(standalone)
		standalone.VisitAll(func(f *flag.Flag) {
			name := prefix + strings.TrimPrefix(f.Name, prefix)
			if up.Lookup(name) == nil {
				t.Errorf("up has no --%s for the %s flag --%s", name, strings.TrimSuffix(prefix, "-"), f.Name)
			}
			if name == f.Name {
				return
			}
			old := up.Lookup(f.Name)
			if old == nil {
				t.Errorf("up has no --%s (deprecated alias or the bridge's)", f.Name)
				return
			}
			_, isAlias := old.Value.(*aliasFlag)
			switch {
			case bridgeOwn.Lookup(f.Name) != nil && isAlias:
				t.Errorf("--%s is the bridge's in up, not an alias of --%s", f.Name, name)
			case bridgeOwn.Lookup(f.Name) == nil && !isAlias:
				t.Errorf("--%s is not a deprecated alias of --%s in up", f.Name, name)
			}
		})
	}
}
