package main

import (
	"encoding/json"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/freeport"
)

// `up -h` lists its flags by component, in the order a person sets them up, without the deprecated
// aliases (still accepted, see TestUpFlagNamesFollowThePrefixRule); every flag is in exactly one group.
func TestUpHelpGroupsFlagsByComponent(t *testing.T) {
	code, out := run(t, "up", "-h")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	groups := []string{"embedded server:", "credentials the components present to the embedded server:",
		"demo publishers (--demo):", "supervision and health:", "streams (declared at start):",
		"bridge (ZMQ to JetStream):", "trace writer:", "gap detector:", "benchmark merger:", "dataset sealer:", "predict service:"}
	at := -1
	for _, g := range groups {
		i := strings.Index(out, "\n"+g+"\n")
		if i < 0 || i < at {
			t.Fatalf("group %q missing or out of order in:\n%s", g, out)
		}
		at = i
	}
	listed := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(out, -1) {
		listed[m[1]]++
	}
	fs := flagSets["up"]
	for name, n := range listed {
		f := fs.Lookup(name)
		switch {
		case f == nil:
			t.Errorf("-h lists --%s, which up does not define", name)
		case n != 1:
			t.Errorf("--%s is listed %d times", name, n)
		case isDeprecatedAlias(f):
			t.Errorf("-h lists the deprecated --%s", name)
		}
	}
	for _, name := range []string{"trace-roll-bytes", "gaps-group", "dp-size", "listen", "sync", "replicas", "demo-rate"} {
		if listed[name] != 1 {
			t.Errorf("--%s is not listed", name)
		}
	}
	for _, old := range []string{"roll-bytes", "group", "rank-timeout", "merge-partition"} {
		if listed[old] != 0 {
			t.Errorf("deprecated --%s is listed", old)
		}
	}
	if !strings.Contains(out, "deprecated flag names are still accepted") {
		t.Error("-h does not say that deprecated names are still accepted")
	}
}

// An unknown flag is answered with the nearest real one and the way to list them, not the whole usage.
func TestUnknownFlagSuggestsTheNearest(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string // the suggestion; "" for none
	}{
		"a typo in up":              {[]string{"up", "--dp-sise", "4"}, "--dp-size"},
		"a missing prefix letter":   {[]string{"trace", "--trace-mod", "full"}, "--trace-mode"},
		"a word of a longer name":   {[]string{"gaps", "report", "--group", "x"}, "--gaps-group"},
		"nothing near":              {[]string{"publish", "--zzzzzzzz"}, ""},
		"an interleaved command":    {[]string{"bench", "merge", "--partial-rank", "a.json"}, "--partial-ranks"},
		"a single dash is the same": {[]string{"datasets", "ls", "-jsn"}, "--json"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := run(t, tc.args...)
			if code != 2 || !strings.Contains(out, "unknown flag") || !strings.Contains(out, "-h` lists the flags") {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			if strings.Contains(out, "usage: fpmbus") || strings.Count(out, "\n") > 2 {
				t.Fatalf("the whole usage is printed:\n%s", out)
			}
			if tc.want == "" && strings.Contains(out, "did you mean") {
				t.Fatalf("suggested something for a flag nothing is near:\n%s", out)
			}
			if tc.want != "" && !strings.Contains(out, "did you mean "+tc.want+"?") {
				t.Fatalf("no suggestion %s:\n%s", tc.want, out)
			}
		})
	}
}

// An unknown command is answered with the nearest one, not the whole list.
func TestUnknownCommandSuggestsTheNearest(t *testing.T) {
	code, out := run(t, "gap", "report")
	if code != 2 || !strings.Contains(out, `did you mean "gaps"?`) || strings.Contains(out, "commands:") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if code, out := run(t, "frobnicate"); code != 2 || strings.Contains(out, "did you mean") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// `fpmbus version` names the module version and the nats-server and nats.go it is built with, the
// versions go.mod requires.
func TestVersion(t *testing.T) {
	var out strings.Builder
	if err := runVersion([]string{"--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range []struct{ path, got string }{{"github.com/nats-io/nats-server/v2", v.NATSServer}, {"github.com/nats-io/nats.go", v.NATSGo}} {
		m := regexp.MustCompile(regexp.QuoteMeta(dep.path) + ` (v\S+)`).FindStringSubmatch(string(mod))
		if m == nil || dep.got != m[1] {
			t.Errorf("%s: version says %q, go.mod requires %v", dep.path, dep.got, m)
		}
	}
	if v.Version == "" || v.Go == "" {
		t.Errorf("%+v", v)
	}
	out.Reset()
	if err := runVersion(nil, &out); err != nil || !strings.HasPrefix(out.String(), "fpmbus ") || !strings.Contains(out.String(), "nats-server "+v.NATSServer) {
		t.Fatalf("%v: %s", err, out.String())
	}
}

// `fpmbus --version` (and -version), as most tools take it, is `fpmbus version`.
func TestVersionFlagIsTheVersionCommand(t *testing.T) {
	for _, flag := range []string{"--version", "-version"} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout := os.Stdout
		os.Stdout = w
		code, out := run(t, flag)
		os.Stdout = stdout
		w.Close()
		printed, _ := io.ReadAll(r)
		r.Close()
		if code != 0 || !strings.HasPrefix(string(printed), "fpmbus ") || !strings.Contains(string(printed), "nats-server ") {
			t.Errorf("fpmbus %s: exit %d, printed %q:\n%s", flag, code, printed, out)
		}
	}
}

// A malformed server URL is refused before any connection attempt, naming where it came from: a
// missing ':' after the scheme used to be looked up in DNS as a host named "nats".
func TestMalformedServerURLIsRefusedAtOnce(t *testing.T) {
	isolateNATSEnv(t)
	t.Setenv("NATS_URL", "nats//127.0.0.1:4222")
	code, out := run(t, "datasets", "ls")
	if code != 2 || !strings.Contains(out, "NATS_URL") || !strings.Contains(out, "is a ':' missing after the scheme?") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	code, out = run(t, "gaps", "report", "--server", "nats://127.0.0.1:4222/fpm")
	if code != 2 || !strings.Contains(out, "--server") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// Commands that only read wait a few seconds for a server, not the half minute of the long-running ones.
func TestReadOnlyCommandsWaitBriefly(t *testing.T) {
	for _, args := range [][]string{{"datasets", "ls", "-h"}, {"gaps", "report", "-h"}, {"trace", "verify", "-h"}, {"datasets", "predict", "-h"}} {
		if _, out := run(t, args...); !regexp.MustCompile(`-connect-timeout duration\n.*\(default 5s\)`).MatchString(out) {
			t.Errorf("%v: --connect-timeout does not default to 5s:\n%s", args, out)
		}
	}
	for _, args := range [][]string{{"trace", "-h"}, {"bridge", "-h"}, {"datasets", "publish", "-h"}} {
		if _, out := run(t, args...); !regexp.MustCompile(`-connect-timeout duration\n.*\(default 30s\)`).MatchString(out) {
			t.Errorf("%v: --connect-timeout does not default to 30s:\n%s", args, out)
		}
	}
}

// `streams apply --dry-run` only reads: with no server there, it gives up after the short wait of the
// commands that only read, naming the server, rather than the half minute of a deployment step.
func TestStreamsApplyDryRunWaitsBriefly(t *testing.T) {
	isolateNATSEnv(t)
	url := "nats://127.0.0.1:" + strconv.Itoa(freeport.Ports(t, 1)[0]) // nothing listens there
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		code, out := run(t, "streams", "apply", "--dry-run", "--server", url)
		done <- result{code, out}
	}()
	select {
	case r := <-done:
		if r.code != 1 || !strings.Contains(r.out, url) {
			t.Fatalf("exit %d, want 1 naming %s:\n%s", r.code, url, r.out)
		}
	case <-time.After(20 * time.Second): // the short wait is 5 s; the long one 30 s
		t.Fatal("streams apply --dry-run still waits for a missing server after 20 s")
	}
	if _, out := run(t, "streams", "apply", "-h"); !strings.Contains(out, "waits 5s for the server") {
		t.Errorf("-h does not say how long --dry-run waits:\n%s", out)
	}
}
