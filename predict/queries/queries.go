// Package queries is how `fpmbus datasets predict` asks the estimator (package predict) from the
// command line: one query from flags (Flags) or many from a JSON-lines file (Read), answered from a
// loaded snapshot (Answer) and printed as a table with each refusal's reason in full (WriteTable). A
// line that is not a query is answered as an invalid_query refusal, so one bad line hides no other;
// a bad flag or an unreadable file is an invalid.FlagError.
package queries

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/fpmbus/fpmbus/consumers/seal"
	"github.com/fpmbus/fpmbus/internal/flagprefix"
	"github.com/fpmbus/fpmbus/internal/invalid"
	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/schemas"
)

// Flags are the flags that make one query; --queries replaces them all.
type Flags struct {
	key, identity, phase                      string
	prefillRequests, prefillTokens, prefillKV int64
	decodeRequests, decodeKV                  int64
	features                                  stringList
	given                                     func() bool
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// RegisterFlags registers the flags of one query: --key, --identity, --phase, --prefill-…,
// --decode-…, --feature.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
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

// Query builds the one query of the flags; a bad --identity is an invalid.FlagError.
func (f *Flags) Query() (predict.Query, error) {
	q := predict.Query{Key: f.key, Features: f.features, Step: predict.Step{Phase: f.phase,
		NumPrefillRequests: f.prefillRequests, SumPrefillTokens: f.prefillTokens, SumPrefillKVTokens: f.prefillKV,
		NumDecodeRequests: f.decodeRequests, SumDecodeKVTokens: f.decodeKV}}
	if f.identity != "" {
		raw := []byte(f.identity)
		if path, ok := strings.CutPrefix(f.identity, "@"); ok {
			b, err := os.ReadFile(path)
			if err != nil {
				return q, invalid.Flagf("--identity: %v", err)
			}
			raw = b
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var id schemas.CellIdentity
		if err := dec.Decode(&id); err != nil {
			return q, invalid.Flagf("--identity: not a cell identity: %v", err)
		}
		q.Identity = &id
	}
	return q, nil
}

// Given reports whether any flag of the one query was given.
func (f *Flags) Given() bool { return f.given() }

// Input is one query to answer: its label in the text table and either a query or the error that
// kept the input from being one.
type Input struct {
	Label string
	Query predict.Query
	Err   error
}

// Read reads JSON-lines queries from path ("-": stdin). Blank lines are skipped; a line that is
// not a query becomes an invalid_query refusal, not an error, so one bad line does not hide the rest.
func Read(path string) ([]Input, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, invalid.Flagf("--queries: %v", err)
		}
		defer f.Close()
		r = f
	}
	var in []Input
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
		in = append(in, Input{Label: label, Query: q, Err: err})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--queries %s: %w", path, err)
	}
	return in, nil
}

// Answer answers every input from snap (an input that is no query as invalid_query) and counts the
// refusals.
func Answer(snap *predict.Snapshot, in []Input, opts predict.Options) (answers []predict.Answer, refused int) {
	answers = make([]predict.Answer, len(in))
	for i, x := range in {
		if x.Err != nil {
			answers[i] = predict.InvalidQuery(x.Err)
		} else {
			answers[i] = snap.Predict(x.Query, opts)
		}
		if answers[i].Refused() {
			refused++
		}
	}
	return answers, refused
}

// WriteTable writes the text table: one row per query, then each refusal's reason in full.
func WriteTable(w io.Writer, in []Input, answers []predict.Answer) error {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in[i].Label, stepText(a.Query.Step), a.Status, lat, cell, rev, digest, fromText(&a))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, a := range answers {
		if a.Refusal != nil {
			fmt.Fprintf(w, "refused %s: %s: %s\n", in[i].Label, a.Refusal.Reason, a.Refusal.Detail)
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
