package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/predict/service"
	"github.com/fpmbus/fpmbus/schemas"
)

// ExitRefused is the exit status of `fpmbus datasets predict` when at least one query was refused
// (each refusal is printed with its reason); 0 means every query was answered.
const ExitRefused = 5

// refusedError makes a run with refusals exit ExitRefused.
type refusedError struct{ refused, total int }

func (e *refusedError) Error() string {
	return fmt.Sprintf("%d of %d queries refused (reasons above)", e.refused, e.total)
}
func (e *refusedError) ExitCode() int { return ExitRefused }

// predictQueryFlags are the flags that make one query; --queries replaces them all.
type predictQueryFlags struct {
	key, identity, phase                      string
	prefillRequests, prefillTokens, prefillKV int64
	decodeRequests, decodeKV                  int64
	features                                  stringList
	given                                     func() bool
}

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func registerPredictQueryFlags(fs *flag.FlagSet) *predictQueryFlags {
	f := &predictQueryFlags{}
	fs.StringVar(&f.key, "key", "", "the deployment's cell key (cell.<sha256>, as fpmbus datasets ls lists it)")
	fs.StringVar(&f.identity, "identity", "", "the deployment's identity as JSON (schemas.CellIdentity), or @FILE to read it from a file")
	fs.StringVar(&f.phase, "phase", "", "prefill, decode or mixed (default: inferred from the coordinates given)")
	fs.Int64Var(&f.prefillRequests, "prefill-requests", 0, "num_prefill_requests of the step")
	fs.Int64Var(&f.prefillTokens, "prefill-tokens", 0, "sum_prefill_tokens: freshly computed tokens of the step")
	fs.Int64Var(&f.prefillKV, "prefill-kv-tokens", 0, "sum_prefill_kv_tokens: cached KV tokens the prefill requests read")
	fs.Int64Var(&f.decodeRequests, "decode-requests", 0, "num_decode_requests of the step")
	fs.Int64Var(&f.decodeKV, "decode-kv-tokens", 0, "sum_decode_kv_tokens: total context the decode requests read")
	fs.Var(&f.features, "feature", "a feature the step uses (repeatable); the surfaces measure none, so any is refused as unsupported")
	names := []string{"key", "identity", "phase", "prefill-requests", "prefill-tokens", "prefill-kv-tokens", "decode-requests", "decode-kv-tokens", "feature"}
	f.given = func() bool {
		for _, n := range names {
			if flagprefix.Given(fs, n) {
				return true
			}
		}
		return false
	}
	return f
}

// query builds the one query of the flags.
func (f *predictQueryFlags) query() (predict.Query, error) {
	q := predict.Query{Key: f.key, Features: f.features, Step: predict.Step{Phase: f.phase,
		NumPrefillRequests: f.prefillRequests, SumPrefillTokens: f.prefillTokens, SumPrefillKVTokens: f.prefillKV,
		NumDecodeRequests: f.decodeRequests, SumDecodeKVTokens: f.decodeKV}}
	if f.identity != "" {
		raw := []byte(f.identity)
		if path, ok := strings.CutPrefix(f.identity, "@"); ok {
			b, err := os.ReadFile(path)
			if err != nil {
				return q, fmt.Errorf("%w: --identity: %v", errUsage, err)
			}
			raw = b
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var id schemas.CellIdentity
		if err := dec.Decode(&id); err != nil {
			return q, fmt.Errorf("%w: --identity: not a cell identity: %v", errUsage, err)
		}
		q.Identity = &id
	}
	return q, nil
}

// predictInput is one query to answer: its label in the text table and either a query or the error
// that kept the input from being one.
type predictInput struct {
	label string
	query predict.Query
	err   error
}

// readQueries reads JSON-lines queries from path ("-": stdin). Blank lines are skipped; a line that is
// not a query becomes an invalid_query refusal, not an error, so one bad line does not hide the rest.
func readQueries(path string) ([]predictInput, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("%w: --queries: %v", errUsage, err)
		}
		defer f.Close()
		r = f
	}
	var in []predictInput
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		q, err := predict.DecodeQuery(line)
		label := q.ID
		if label == "" {
			label = fmt.Sprintf("%s:%d", path, n)
		}
		in = append(in, predictInput{label: label, query: q, err: err})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--queries %s: %w", path, err)
	}
	return in, nil
}

func runDatasetsPredict(ctx context.Context, args []string, w io.Writer) error {
	fs, conn, scfg := datasetsFlagSet("predict", "datasets predict (--key KEY | --identity JSON|@FILE) [--phase P] [--prefill-… N] [--decode-… N] | --queries FILE [--require-complete] [--json]")
	qf := registerPredictQueryFlags(fs)
	queries := fs.String("queries", "", "answer the queries of a JSON-lines file, one query object a line (\"-\": stdin), instead of one query from flags")
	requireComplete := fs.Bool("require-complete", false, "refuse cells whose campaign is not complete (every frozen cell sealed)")
	asJSON := fs.Bool("json", false, "print one answer per line as JSON (the service's reply format) instead of a table")
	if _, err := datasetsParse(fs, args, 0, "no arguments besides flags"); err != nil {
		return err
	}
	var in []predictInput
	switch {
	case *queries != "" && qf.given():
		return fmt.Errorf("%w: --queries replaces the single-query flags (--key, --identity, --phase, --prefill-…, --decode-…, --feature)", errUsage)
	case *queries != "":
		var err error
		if in, err = readQueries(*queries); err != nil {
			return err
		}
	case qf.given():
		q, err := qf.query()
		if err != nil {
			return err
		}
		in = []predictInput{{label: "-", query: q}}
	default:
		return fmt.Errorf("%w: give one query (--key or --identity and the step's coordinates) or --queries FILE", errUsage)
	}
	kv, closeConn, err := openKV(ctx, conn, scfg)
	if err != nil {
		return err
	}
	defer closeConn()
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	snap, err := service.Load(lctx, kv)
	if err != nil {
		return fmt.Errorf("load %s: %w", kv.Bucket(), err)
	}
	answers := make([]predict.Answer, len(in))
	refused := 0
	for i, x := range in {
		if x.err != nil {
			answers[i] = predict.InvalidQuery(x.err)
		} else {
			answers[i] = snap.Predict(x.query, predict.Options{RequireComplete: *requireComplete})
		}
		if answers[i].Refused() {
			refused++
		}
	}
	if *asJSON {
		enc := json.NewEncoder(w)
		for i := range answers {
			if err := enc.Encode(&answers[i]); err != nil {
				return err
			}
		}
	} else if err := printAnswers(w, in, answers); err != nil {
		return err
	}
	if refused > 0 {
		return &refusedError{refused: refused, total: len(answers)}
	}
	return nil
}

// printAnswers writes the text table: one row per query, then each refusal's reason in full.
func printAnswers(w io.Writer, in []predictInput, answers []predict.Answer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUERY\tSTEP\tSTATUS\tLATENCY MS\tCELL\tREV\tDATASET DIGEST\tFROM")
	for i, a := range answers {
		lat, cell, rev, digest := "-", "-", "-", "-"
		if a.LatencyMS != nil {
			lat = fmt.Sprintf("%.4g", *a.LatencyMS)
		}
		if a.Cell != nil {
			cell = seal.ShortDigest(strings.TrimPrefix(a.Cell.Key, schemas.CellKeyPrefix))
			if a.Cell.Revision > 0 {
				rev = fmt.Sprint(a.Cell.Revision)
			}
			if a.Cell.DatasetDigest != "" {
				digest = seal.ShortDigest(a.Cell.DatasetDigest)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in[i].label, stepText(a.Query.Step), a.Status, lat, cell, rev, digest, fromText(&a))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, a := range answers {
		if a.Refusal != nil {
			fmt.Fprintf(w, "refused %s: %s: %s\n", in[i].label, a.Refusal.Reason, a.Refusal.Detail)
		}
	}
	return nil
}

func stepText(s predict.Step) string {
	var parts []string
	if s.Phase != predict.PhaseDecode && (s.NumPrefillRequests != 0 || s.SumPrefillTokens != 0) {
		parts = append(parts, fmt.Sprintf("prefill %d/%d/%d", s.NumPrefillRequests, s.SumPrefillTokens, s.SumPrefillKVTokens))
	}
	if s.Phase != predict.PhasePrefill && (s.NumDecodeRequests != 0 || s.SumDecodeKVTokens != 0) {
		parts = append(parts, fmt.Sprintf("decode %d/%d", s.NumDecodeRequests, s.SumDecodeKVTokens))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " + ")
}

// fromText says what an answer was computed from: the points used, the composition, or the reason.
func fromText(a *predict.Answer) string {
	switch {
	case a.Refusal != nil:
		return string(a.Refusal.Reason)
	case a.Composition != nil:
		c := a.Composition
		s := fmt.Sprintf("%.4g + max(0, %.4g - %.4g)", c.PrefillMS, c.DecodeMS, c.DecodeBaselineMS)
		if c.Clamped {
			s += " clamped"
		}
		return s
	case len(a.Parts) == 1:
		return fmt.Sprintf("%d point(s)", len(a.Parts[0].Points))
	}
	return ""
}
