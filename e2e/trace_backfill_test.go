package e2e

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// sameEvents fails unless the segments under out and under want hold the same events per producer,
// in the same order.
func sameEvents(t *testing.T, out, want string) {
	t.Helper()
	got, ref := eventsByProducer(t, out+".*"+tracefile.SegmentSuffix), eventsByProducer(t, want+".*"+tracefile.SegmentSuffix)
	if len(got) != len(ref) || len(ref) == 0 {
		t.Fatalf("producers: %d, want %d", len(got), len(ref))
	}
	for p, evs := range ref {
		if strings.Join(got[p], "\n") != strings.Join(evs, "\n") {
			t.Fatalf("producer %s: %d events, want %d, or they differ", p, len(got[p]), len(evs))
		}
	}
}

// `fpmbus trace backfill` run again over a range into the same output writes no line twice: in full
// mode every message of the range is in the files once, in stream order, after a partial run, a rerun
// of the whole range and a rerun of a range inside it; in sampled mode the same reruns leave exactly the
// lines one backfill of the whole range writes into an empty output (one per key and interval).
func TestTraceBackfillRerunWritesNoLineTwice(t *testing.T) {
	t.Parallel()
	const total = 4000 // 4 keys, observed 1 ms apart: 1,000 messages per sampled interval of 1 s
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 30*time.Second)
	seqs := streamSeqs(t, env.JS)
	dir := t.TempDir()
	backfill := func(t *testing.T, mode, out string, rng ...string) string {
		t.Helper()
		args := append([]string{"trace", "backfill", "--server", url, "--trace-mode", mode, "--trace-output", out,
			"--sample-interval", "1000", "--roll-bytes", "200000", "--max-segments", "1000", "--progress", "none"}, rng...)
		o, err := run(t, 60*time.Second, fpmbusBin, args...)
		if err != nil {
			t.Fatalf("backfill %s: %v\n%s", strings.Join(rng, " "), err, o)
		}
		return o
	}
	for _, mode := range []string{"full", "sampled"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(dir, mode, "fpm")
			backfill(t, mode, out, "--start-seq", "1", "--end-seq", "2000") // two whole sampled intervals
			rerun := backfill(t, mode, out, "--start-seq", "1")
			again := backfill(t, mode, out, "--start-seq", "1001", "--end-seq", "3000")
			if mode == "full" {
				checkFullLines(t, seqs, out, 1, total)
			} else {
				ref := filepath.Join(dir, mode, "reference", "fpm")
				backfill(t, mode, ref, "--start-seq", "1")
				sameEvents(t, out, ref)
			}
			if !strings.Contains(rerun, "already in the output") || !strings.Contains(again, " 0 "+mode+" lines") {
				t.Fatalf("the reruns do not say that they found the lines written:\n%s\n%s", rerun, again)
			}
		})
	}
}

// resumeSeqRE finds the sequence an interrupted backfill says to resume from.
var resumeSeqRE = regexp.MustCompile(`--resume-seq (\d+)`)

// backfillDoneRE reads the count of a backfill's progress bar.
var backfillDoneRE = regexp.MustCompile(`\((\d+)/(\d+),`)

// `fpmbus trace backfill` interrupted by SIGINT mid-range says which stream sequence to resume from
// (full mode: every message before it has its line, none after it), and a run with --resume-seq
// continues there: afterwards the output holds exactly what one uninterrupted backfill writes (full:
// every message of the range once, in stream order; sampled: the same lines as a backfill of the whole
// range into an empty output).
func TestTraceBackfillInterruptedResumesExactly(t *testing.T) {
	t.Parallel()
	const total = 120_000
	env := natsservertest.Start(t)
	url := env.Server.ClientURL()
	fillFPM(t, env.JS, total, 2, 2, 1_782_777_600_000)
	waitStreamCount(t, env.JS, streams.StreamFPM, total, 60*time.Second)
	seqs := streamSeqs(t, env.JS)
	dir := t.TempDir()
	for _, mode := range []string{"full", "sampled"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(dir, mode, "fpm")
			args := []string{"trace", "backfill", "--server", url, "--trace-mode", mode, "--trace-output", out,
				"--sample-interval", "1000", "--roll-bytes", "4000000", "--max-segments", "1000", "--start-seq", "1"}
			p := fpmbus(t, "backfill "+mode, append(args, "--progress", "bar")...)
			// Past a few sampled intervals (1,000 messages each), far from the end.
			eventually(t, 60*time.Second, func() error {
				m := backfillDoneRE.FindAllStringSubmatch(p.Output(), -1)
				if len(m) == 0 {
					return fmt.Errorf("no progress yet")
				}
				if done, _ := strconv.Atoi(m[len(m)-1][1]); done < 5000 {
					return fmt.Errorf("%d messages read", done)
				}
				return nil
			})
			err := p.signal(syscall.SIGINT, 60*time.Second)
			o := p.Output()
			m := resumeSeqRE.FindStringSubmatch(o)
			if err == nil || m == nil {
				t.Fatalf("backfill interrupted by SIGINT: %v, and no --resume-seq in its output:\n%s", err, o)
			}
			resume, _ := strconv.ParseUint(m[1], 10, 64)
			if resume <= 1 || resume > total {
				t.Fatalf("resume from %d: the interruption came at the start or after the end (%d messages)\n%s", resume, total, o)
			}
			if mode == "full" {
				checkFullLines(t, seqs, out, 1, resume-1) // every message before it written, none after
			}
			if o, err := run(t, 120*time.Second, fpmbusBin, append(args, "--progress", "none", "--resume-seq", m[1])...); err != nil {
				t.Fatalf("resumed backfill: %v\n%s", err, o)
			}
			t.Logf("interrupted at stream sequence %d of %d, resumed", resume, total)
			if mode == "full" {
				checkFullLines(t, seqs, out, 1, total)
				return
			}
			ref := filepath.Join(dir, mode, "reference", "fpm")
			if o, err := run(t, 120*time.Second, fpmbusBin, "trace", "backfill", "--server", url, "--trace-mode", mode, "--trace-output", ref,
				"--sample-interval", "1000", "--roll-bytes", "4000000", "--max-segments", "1000", "--start-seq", "1", "--progress", "none"); err != nil {
				t.Fatalf("reference backfill: %v\n%s", err, o)
			}
			sameEvents(t, out, ref)
		})
	}
}
