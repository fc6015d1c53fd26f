package trace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/tracefile"
)

// events returns, per producer, the "event" objects of its lines in file order (the bytes between
// `"event":` and the line's closing brace: everything but the writer-relative timestamp).
func events(t *testing.T, outputPath string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for p, lines := range outputLines(t, outputPath) {
		for _, l := range lines {
			i := bytes.Index(l, []byte(`,"event":`))
			if i < 0 || l[len(l)-1] != '}' {
				t.Fatalf("%s: not a trace line: %s", p, l)
			}
			out[p] = append(out[p], string(l[i+len(`,"event":`):len(l)-1]))
		}
	}
	return out
}

// observedOf returns an event's observed_at_unix_ms.
func observedOf(t *testing.T, event string) int64 {
	t.Helper()
	tl, err := schemas.ParseTraceLine([]byte(`{"timestamp":0,"event":` + event + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return tl.Event.ObservedAtUnixMs
}

// A backfill over a range writes the same event objects, in the same order, as the live writer wrote
// for that range, in both modes, and leaves the live durable consumer alone.
func TestBackfillWritesTheLiveWritersEvents(t *testing.T) {
	t.Parallel()
	const (
		n     = 4000
		base  = 1_782_777_600_000 // a multiple of the interval
		step  = 10                // ms between observations
		ivlMs = 2000
	)
	env := natsservertest.Start(t)
	keys := testKeys(4)
	var fs []testFPM
	for i := range n {
		fs = append(fs, testFPM{key: keys[i%4], counter: int64(i / 4), receivedMs: base + int64(i)*step, heartbeat: i%10 == 9})
	}
	msgs := make([]*nats.Msg, 0, n)
	for _, f := range fs {
		msgs = append(msgs, f.msg(t))
	}
	publish(t, env.JS, msgs)
	stamps := map[uint64]time.Time{} // stream sequence -> stream timestamp
	for _, m := range natsservertest.Messages(t, env.JS, streams.StreamFPM, ">") {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		stamps[md.Sequence.Stream] = md.Timestamp
	}
	observedAt := func(seq uint64) int64 { return base + int64(seq-1)*step }

	live := map[string]map[string][]string{}
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		cfg := testConfig(t)
		cfg.Mode = Mode(mode)
		cfg.Group = "live-" + mode
		cfg.SampleInterval = ivlMs * time.Millisecond
		reg := prometheus.NewRegistry()
		cfg.Registerer = reg
		r := startWriter(t, cfg, env.JS)
		waitHanded(t, reg, n)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		live[mode] = events(t, cfg.OutputPath)
	}

	for name, tc := range map[string]struct {
		mode string
		rng  BackfillRange
		// the messages the range selects, by observed_at
		from, to int64
	}{
		"full, the whole stream":       {mode: schemas.CaptureFull, from: observedAt(1), to: observedAt(n)},
		"full, a sequence range":       {mode: schemas.CaptureFull, rng: BackfillRange{StartSeq: 1001, EndSeq: 3000}, from: observedAt(1001), to: observedAt(3000)},
		"full, from a sequence on":     {mode: schemas.CaptureFull, rng: BackfillRange{StartSeq: 3901}, from: observedAt(3901), to: observedAt(n)},
		"full, a time range":           {mode: schemas.CaptureFull, rng: BackfillRange{Since: stamps[500], Until: stamps[2500]}},
		"sampled, the whole stream":    {mode: schemas.CaptureSampled, from: observedAt(1), to: observedAt(n)},
		"sampled, whole intervals 3-6": {mode: schemas.CaptureSampled, rng: BackfillRange{StartSeq: 3*200 + 1, EndSeq: 7 * 200}, from: observedAt(601), to: observedAt(1400)},
	} {
		t.Run(name, func(t *testing.T) {
			if !tc.rng.Since.IsZero() { // by stream time: the messages stored within it
				tc.from, tc.to = -1, -1
				for seq := uint64(1); seq <= n; seq++ {
					if ts := stamps[seq]; !ts.Before(tc.rng.Since) && !ts.After(tc.rng.Until) {
						if tc.from < 0 {
							tc.from = observedAt(seq)
						}
						tc.to = observedAt(seq)
					}
				}
			}
			cfg := testConfig(t)
			cfg.Mode = Mode(tc.mode)
			cfg.SampleInterval = ivlMs * time.Millisecond
			cfg.OutputPath = filepath.Join(t.TempDir(), "backfill", "fpm")
			var last BackfillProgress
			calls := 0
			res, err := Backfill(context.Background(), logTo(cfg, testLogger(t)), env.JS, tc.rng, func(p BackfillProgress) { last = p; calls++ })
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]string{}
			for p, evs := range live[tc.mode] {
				for _, e := range evs {
					if o := observedOf(t, e); o >= tc.from && o <= tc.to {
						want[p] = append(want[p], e)
					}
				}
			}
			got := events(t, cfg.OutputPath)
			if len(got) != len(want) {
				t.Fatalf("producers %v, want %v", keysOf2(got), keysOf2(want))
			}
			for p := range want {
				if len(got[p]) != len(want[p]) {
					t.Fatalf("%s: %d events, live wrote %d for the range", p, len(got[p]), len(want[p]))
				}
				for i := range want[p] {
					if got[p][i] != want[p][i] {
						t.Fatalf("%s event %d:\n got %s\nwant %s", p, i, got[p][i], want[p][i])
					}
				}
			}
			msgs := uint64((tc.to-tc.from)/step + 1)
			if res.Messages != msgs || last.Done != msgs || last.Total != msgs || calls == 0 {
				t.Fatalf("result %+v, last progress %+v (%d calls), want %d messages", res, last, calls, msgs)
			}
			if tc.mode == schemas.CaptureFull && res.Lines != msgs {
				t.Fatalf("lines %d, want %d", res.Lines, msgs)
			}
		})
	}

	// The live durables were not touched.
	for _, mode := range []string{schemas.CaptureFull, schemas.CaptureSampled} {
		c, err := env.JS.PushConsumer(context.Background(), streams.StreamFPM, "live-"+mode)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if ci.Delivered.Stream != n || ci.AckFloor.Stream != n || ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
			t.Fatalf("live consumer %s changed: %+v", ci.Name, ci)
		}
	}
}

func TestBackfillRanges(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	msgs, _ := manyFPMs(t, testKeys(2), 20, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	now := time.Now()
	for name, tc := range map[string]struct {
		rng      BackfillRange
		wantErr  error
		messages uint64
	}{
		"sequence and time together": {rng: BackfillRange{StartSeq: 1, Until: now}, wantErr: ErrBadRange},
		"end before start":           {rng: BackfillRange{StartSeq: 10, EndSeq: 9}, wantErr: ErrBadRange},
		"until before since":         {rng: BackfillRange{Since: now, Until: now.Add(-time.Second)}, wantErr: ErrBadRange},
		"a range past the stream":    {rng: BackfillRange{StartSeq: 100, EndSeq: 200}, messages: 0},
		"one message":                {rng: BackfillRange{StartSeq: 7, EndSeq: 7}, messages: 1},
		"a time range in the future": {rng: BackfillRange{Since: now.Add(time.Hour)}, messages: 0},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := Backfill(ctx, logTo(cfg, testLogger(t)), env.JS, tc.rng, nil)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Messages != tc.messages {
				t.Fatalf("messages %d, want %d", res.Messages, tc.messages)
			}
			lines := 0
			for _, ls := range outputLines(t, cfg.OutputPath) {
				lines += len(ls)
			}
			if uint64(lines) != tc.messages {
				t.Fatalf("lines %d, want %d", lines, tc.messages)
			}
		})
	}
}

func keysOf2(m map[string][]string) string {
	out := map[string]int{}
	for k, v := range m {
		out[k] = len(v)
	}
	return fmt.Sprint(out)
}

// A backfill owns every producer of its output before it repairs or writes anything: into an output a
// running writer holds it is refused, naming the writer, and nothing there changes; into another output
// it runs.
func TestBackfillIsRefusedWhileAWriterOwnsTheOutput(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	msgs, _ := manyFPMs(t, testKeys(4), 400, 1_782_777_600_000)
	publish(t, env.JS, msgs)
	cfg := testConfig(t)
	r := startWriter(t, cfg, env.JS)
	waitConsumed(t, env.JS, cfg.Group)
	files := func(output string) map[string]int64 {
		out := map[string]int64{}
		matches, _ := filepath.Glob(tracefile.OutputBase(output) + ".*" + tracefile.SegmentSuffix)
		for _, m := range matches {
			fi, err := os.Stat(m)
			if err != nil {
				t.Fatal(err)
			}
			out[m] = fi.Size()
		}
		return out
	}
	before := files(cfg.OutputPath)
	_, err := Backfill(context.Background(), logTo(cfg, testLogger(t)), env.JS, BackfillRange{}, nil)
	var held *fsutil.HeldError
	if !errors.Is(err, tracefile.ErrPrefixHeld) || !errors.As(err, &held) || held.Holder == nil || held.Holder.Role != "trace writer" || !strings.Contains(err.Error(), "trace backfill") {
		t.Fatalf("backfill into the writer's output: %v, want it refused naming the writer", err)
	}
	if after := files(cfg.OutputPath); !maps.Equal(before, after) {
		t.Fatalf("the refused backfill changed the writer's files: %v, then %v", before, after)
	}
	other := cfg
	other.OutputPath = filepath.Join(t.TempDir(), "backfill", "fpm")
	res, err := Backfill(context.Background(), logTo(other, testLogger(t)), env.JS, BackfillRange{}, nil)
	if err != nil || res.Lines != uint64(len(msgs)) {
		t.Fatalf("backfill into another output: %+v, %v", res, err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}
