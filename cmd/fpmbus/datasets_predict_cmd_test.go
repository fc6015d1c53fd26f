package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// predictEnv is an embedded server whose FPM_DATASETS holds the estimator's fixture bucket.
func predictEnv(t *testing.T) (url string, entries map[string]json.RawMessage) {
	t.Helper()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := env.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: streams.BucketDatasets, History: 64})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("../../predict/testdata/fpm_datasets.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries = map[string]json.RawMessage{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, e.Key, e.Value); err != nil { // a campaign record's revisions in order
			t.Fatal(err)
		}
		entries[e.Key] = e.Value
	}
	return env.Server.ClientURL(), entries
}

func predictCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helpOutput = io.Discard
	t.Cleanup(func() { helpOutput = discardHelp })
	var out bytes.Buffer
	err := runDatasetsPredict(context.Background(), args, &out)
	return out.String(), err
}

func exitCode(err error) int {
	var ec exitCoder
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return ec.ExitCode()
	case errors.Is(err, errUsage):
		return 2
	}
	return 1
}

// `fpmbus datasets predict --queries FILE --json` prints the estimator's answers, one a line, and exits
// 5 because the golden queries include refusals; a file of answerable queries exits 0.
func TestDatasetsPredictQueriesFile(t *testing.T) {
	url, _ := predictEnv(t)
	golden := "../../predict/testdata/queries.jsonl"
	out, err := predictCmd(t, "--server", url, "--queries", golden, "--json")
	if exitCode(err) != ExitRefused || !strings.Contains(err.Error(), "queries refused") {
		t.Fatalf("exit %d (%v)", exitCode(err), err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := strings.Split(strings.TrimSpace(readFile(t, golden)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d answers for %d queries:\n%s", len(lines), len(want), out)
	}
	// The answers are the estimator's over the same bucket (revisions differ from the fixture dump's,
	// so compare everything else).
	for i, l := range lines {
		var a predict.Answer
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatal(err)
		}
		var q predict.Query
		_ = json.Unmarshal([]byte(want[i]), &q)
		if a.Query.ID != q.ID || a.Source != predict.Source {
			t.Fatalf("answer %d: %s", i, l)
		}
	}
	// Only answerable queries: exit 0, and the table shows each with its status.
	ok := filepath.Join(t.TempDir(), "ok.jsonl")
	var keep []string
	for _, l := range want {
		if strings.Contains(l, `"measured `) || strings.Contains(l, `"interpolated `) || strings.Contains(l, `"mixed"`) {
			keep = append(keep, l)
		}
	}
	if err := os.WriteFile(ok, []byte(strings.Join(keep, "\n")+"\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = predictCmd(t, "--server", url, "--queries", ok)
	if err != nil || strings.Count(out, "measured")+strings.Count(out, "interpolated")+strings.Count(out, "composed") < len(keep) || strings.Contains(out, "refused") {
		t.Fatalf("exit %d (%v):\n%s", exitCode(err), err, out)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// One query from flags, by key or by identity (inline or @FILE); a refusal prints its reason and
// exits 5; a line that is not a query is refused, not fatal; usage errors exit 2.
func TestDatasetsPredictFlags(t *testing.T) {
	url, entries := predictEnv(t)
	var key string
	var id schemas.CellIdentity
	for k, v := range entries {
		var c schemas.SealedCell
		if json.Unmarshal(v, &c) == nil && c.Identity.Model == "fixture/model-a" && c.Identity.Parallelism.TP == 4 {
			key, id = k, c.Identity
		}
	}
	idJSON, _ := json.Marshal(id)
	idFile := filepath.Join(t.TempDir(), "identity.json")
	if err := os.WriteFile(idFile, idJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"by key, interpolated":  {[]string{"--key", key, "--decode-requests", "8", "--decode-kv-tokens", "20480"}, 0, "interpolated 9.5"},
		"by identity, measured": {[]string{"--identity", string(idJSON), "--prefill-requests", "2", "--prefill-tokens", "1024"}, 0, "measured 34"},
		"identity from a file":  {[]string{"--identity", "@" + idFile, "--phase", "mixed", "--prefill-requests", "1", "--prefill-tokens", "128", "--decode-requests", "8", "--decode-kv-tokens", "32768"}, 0, "composed 15 "},
		"out of domain":         {[]string{"--key", key, "--decode-requests", "64", "--decode-kv-tokens", "65536"}, ExitRefused, "refused -: out_of_domain: decode num_decode_requests 64 is above the largest measured value 32"},
		"unsupported feature":   {[]string{"--key", key, "--decode-requests", "8", "--decode-kv-tokens", "8192", "--feature", "lora"}, ExitRefused, "unsupported_feature"},
		"queries and flags":     {[]string{"--queries", "x", "--key", key}, 2, ""},
		"no query":              {nil, 2, ""},
		"identity is not JSON":  {[]string{"--identity", "{", "--decode-requests", "1", "--decode-kv-tokens", "1"}, 2, ""},
		"identity file missing": {[]string{"--identity", "@/nonexistent", "--decode-requests", "1", "--decode-kv-tokens", "1"}, 2, ""},
		"queries file missing":  {[]string{"--queries", "/nonexistent"}, 2, ""},
		"a positional argument": {[]string{"--key", key, "extra"}, 2, ""},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := predictCmd(t, append([]string{"--server", url}, tc.args...)...)
			if exitCode(err) != tc.code || !strings.Contains(strings.Join(strings.Fields(out), " "), tc.want) {
				t.Fatalf("exit %d (%v), want %d with %q:\n%s", exitCode(err), err, tc.code, tc.want, out)
			}
		})
	}
	// A bad line among good ones is refused; the others are answered.
	mixed := filepath.Join(t.TempDir(), "q.jsonl")
	if err := os.WriteFile(mixed, []byte(`{"key":"`+key+`","step":{"num_decode_requests":8,"sum_decode_kv_tokens":8192}}`+"\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := predictCmd(t, "--server", url, "--queries", mixed)
	if exitCode(err) != ExitRefused || !strings.Contains(out, "measured") || !strings.Contains(out, "q.jsonl:2: invalid_query") {
		t.Fatalf("exit %d:\n%s", exitCode(err), out)
	}
}

// The predict service's flags carry the predict- prefix in `up`, and being new there, have no
// unprefixed alias.
func TestUpPredictFlags(t *testing.T) {
	up := flag.NewFlagSet("up", flag.ContinueOnError)
	up.SetOutput(io.Discard)
	upFlags(up)
	standalone := flag.NewFlagSet("predict", flag.ContinueOnError)
	predictFlags(standalone, "")
	standalone.VisitAll(func(f *flag.Flag) {
		if up.Lookup(predictPrefix+f.Name) == nil || up.Lookup(f.Name) != nil {
			t.Errorf("up: --%s%s missing or --%s present", predictPrefix, f.Name, f.Name)
		}
	})
}
