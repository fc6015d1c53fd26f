package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/predict/queries"
	"github.com/fpmbus/fpmbus/predict/service"
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

func runDatasetsPredict(ctx context.Context, args []string, w io.Writer) error {
	fs, conn, scfg := datasetsFlagSet("predict", "datasets predict (--key KEY | --identity JSON|@FILE) [--phase P] [--prefill-… N] [--decode-… N] | --queries FILE [--require-complete] [--json]")
	qf := queries.RegisterFlags(fs)
	queriesFile := fs.String("queries", "", "answer the queries of a JSON-lines file, one query object a line (\"-\": stdin), instead of one query from flags")
	requireComplete := fs.Bool("require-complete", false, "refuse cells whose campaign is not complete (every frozen cell sealed)")
	asJSON := fs.Bool("json", false, "print one answer per line as JSON (the service's reply format) instead of a table")
	if _, err := datasetsParse(fs, args, 0, "no arguments besides flags"); err != nil {
		return err
	}
	var in []queries.Input
	switch {
	case *queriesFile != "" && qf.Given():
		return fmt.Errorf("%w: --queries replaces the single-query flags (--key, --identity, --phase, --prefill-…, --decode-…, --feature)", errUsage)
	case *queriesFile != "":
		var err error
		if in, err = queries.Read(*queriesFile); err != nil {
			return flagUsage(err)
		}
	case qf.Given():
		q, err := qf.Query()
		if err != nil {
			return flagUsage(err)
		}
		in = []queries.Input{{Label: "-", Query: q}}
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
	answers, refused := queries.Answer(snap, in, predict.Options{RequireComplete: *requireComplete})
	if *asJSON {
		enc := json.NewEncoder(w)
		for i := range answers {
			if err := enc.Encode(&answers[i]); err != nil {
				return err
			}
		}
	} else if err := queries.WriteTable(w, in, answers); err != nil {
		return err
	}
	if refused > 0 {
		return &refusedError{refused: refused, total: len(answers)}
	}
	return nil
}
