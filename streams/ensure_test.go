package streams_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// publishPatiently lets an asynchronous publish wait for the server as long as a loaded machine needs:
// nats.go's default gives up after 200 ms when its window of publishes in flight is full ("stalled with
// too many outstanding async published messages").
var publishPatiently = jetstream.WithStallWait(30 * time.Second)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// emptyServer is a running server without fpmbus's streams.
func emptyServer(t *testing.T) *natsservertest.Env {
	t.Helper()
	env := natsservertest.Start(t)
	for _, sc := range streams.DefaultConfig().All() {
		if err := env.JS.DeleteStream(t.Context(), sc.Name); err != nil {
			t.Fatalf("delete %s: %v", sc.Name, err)
		}
	}
	return env
}

// operatorStream creates stream FPM as an operator would (`nats stream add`): fpmbus's definition
// with the operator's changes, then stores n FPM-sized messages on it.
func operatorStream(t *testing.T, env *natsservertest.Env, n int, change func(*jetstream.StreamConfig)) jetstream.StreamConfig {
	t.Helper()
	ctx := t.Context()
	if err := env.JS.DeleteStream(ctx, streams.StreamFPM); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatal(err)
	}
	sc := streams.DefaultConfig().FPMStream()
	change(&sc)
	if _, err := env.JS.CreateStream(ctx, sc); err != nil {
		t.Fatalf("create operator's %s: %v", sc.Name, err)
	}
	k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w1", DPRank: 0}
	body := []byte(`{"version":1,"worker_id":"w1","dp_rank":0,"counter_id":0,"wall_time":1782777600.5,"num_prefill_requests":3}`)
	for i := range n {
		if _, err := env.JS.PublishAsync(streams.FPMSubject(k), body, jetstream.WithMsgID(streams.MsgID(k, int64(i), 0)), publishPatiently); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-env.JS.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
	return info(t, env.JS, sc.Name).Config
}

func info(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	si, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return si
}

func TestEnsureCreatesMissingStreamsFromConfig(t *testing.T) {
	env := emptyServer(t)
	cfg := streams.DefaultConfig()
	cfg.MaxBytes, cfg.MaxAge, cfg.DuplicateWindow = 5_000_000, 2*time.Hour, 20*time.Second
	r, err := streams.Ensure(t.Context(), env.JS, cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{streams.StreamFPM, streams.StreamEvents, streams.StreamBench}; !reflect.DeepEqual(r.Created, want) || len(r.Differences) != 0 {
		t.Fatalf("report %+v, want created %v and no differences", r, want)
	}
	for _, want := range cfg.All() {
		if d := streams.Diff(info(t, env.JS, want.Name).Config, want); len(d) != 0 {
			t.Fatalf("%s created with differences %v", want.Name, d)
		}
	}
	// Again: everything exists as wanted; nothing created, nothing differs.
	r, err = streams.Ensure(t.Context(), env.JS, cfg, quiet)
	if err != nil || len(r.Created) != 0 || len(r.Differences) != 0 {
		t.Fatalf("second Ensure: %+v, %v", r, err)
	}
}

// Ensure never changes an existing stream: flags that would shrink an operator's limits (and delete
// most of what the stream holds) are reported, not applied.
func TestEnsureKeepsOperatorsStream(t *testing.T) {
	const stored = 7599
	tests := map[string]struct {
		flags func(*streams.Config)
		want  []streams.Change
	}{
		"smaller max bytes and max age": {
			flags: func(c *streams.Config) { c.MaxBytes, c.MaxAge = 100_000, time.Minute },
			want: []streams.Change{
				{Stream: "FPM", Setting: "max_bytes", Current: "2000000", Wanted: "100000", Destructive: true},
				{Stream: "FPM", Setting: "max_age", Current: "1h0m0s", Wanted: "1m0s", Destructive: true},
			},
		},
		"default flags": {
			flags: func(c *streams.Config) {},
			want: []streams.Change{
				{Stream: "FPM", Setting: "max_bytes", Current: "2000000", Wanted: "10737418240"},
				{Stream: "FPM", Setting: "max_age", Current: "1h0m0s", Wanted: "168h0m0s"},
			},
		},
		"memory storage and a shorter window": {
			flags: func(c *streams.Config) { c.Storage, c.DuplicateWindow = jetstream.MemoryStorage, 5*time.Second },
			want: []streams.Change{
				{Stream: "FPM", Setting: "max_bytes", Current: "2000000", Wanted: "10737418240"},
				{Stream: "FPM", Setting: "max_age", Current: "1h0m0s", Wanted: "168h0m0s"},
				{Stream: "FPM", Setting: "storage", Current: "file", Wanted: "memory", Destructive: true},
				{Stream: "FPM", Setting: "duplicate_window", Current: "30s", Wanted: "5s"},
			},
		},
	}
	env := natsservertest.Start(t)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := operatorStream(t, env, stored, func(sc *jetstream.StreamConfig) { sc.MaxBytes, sc.MaxAge = 2_000_000, time.Hour })
			if n := info(t, env.JS, streams.StreamFPM).State.Msgs; n != stored {
				t.Fatalf("operator's stream holds %d messages, want %d", n, stored)
			}
			cfg := streams.DefaultConfig()
			tc.flags(&cfg)
			r, err := streams.Ensure(t.Context(), env.JS, cfg, quiet)
			if err != nil {
				t.Fatal(err)
			}
			var fpm []streams.Change
			for _, c := range r.Differences {
				if c.Stream == streams.StreamFPM {
					fpm = append(fpm, c)
				}
			}
			if !reflect.DeepEqual(fpm, tc.want) {
				t.Fatalf("differences of FPM:\n got %+v\nwant %+v", fpm, tc.want)
			}
			after := info(t, env.JS, streams.StreamFPM)
			if !reflect.DeepEqual(after.Config, before) {
				t.Fatalf("stream changed:\n before %+v\n after  %+v", before, after.Config)
			}
			if after.State.Msgs != stored {
				t.Fatalf("stream holds %d messages after Ensure, want %d", after.State.Msgs, stored)
			}
		})
	}
}

func TestEnsureRefusesStreamItCannotUse(t *testing.T) {
	tests := map[string]struct {
		change   func(*jetstream.StreamConfig)
		usable   bool
		setting  string
		noneKept bool // interest retention without consumers stores nothing
	}{
		"subjects miss fpm.>":      {change: func(sc *jetstream.StreamConfig) { sc.Subjects = []string{"fpm.dynamo.>"} }, setting: "subjects"},
		"interest retention":       {change: func(sc *jetstream.StreamConfig) { sc.Retention = jetstream.InterestPolicy }, setting: "retention", noneKept: true},
		"subjects capture more":    {change: func(sc *jetstream.StreamConfig) { sc.Subjects = []string{"fpm.>", "legacy.>"} }, usable: true},
		"short duplicate window":   {change: func(sc *jetstream.StreamConfig) { sc.Duplicates = time.Second }, usable: true},
		"discard new when full":    {change: func(sc *jetstream.StreamConfig) { sc.Discard = jetstream.DiscardNew }, usable: true},
		"no direct get":            {change: func(sc *jetstream.StreamConfig) { sc.AllowDirect = false }, usable: true},
		"message count limit only": {change: func(sc *jetstream.StreamConfig) { sc.MaxMsgs, sc.MaxBytes = 1000, -1 }, usable: true},
	}
	env := natsservertest.Start(t)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := operatorStream(t, env, 10, tc.change)
			_, err := streams.Ensure(t.Context(), env.JS, streams.DefaultConfig(), quiet)
			switch {
			case tc.usable && err != nil:
				t.Fatalf("Ensure: %v", err)
			case !tc.usable && !errors.Is(err, streams.ErrIncompatible):
				t.Fatalf("Ensure: %v, want ErrIncompatible", err)
			case !tc.usable:
				if want := "setting " + tc.setting + " "; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "stream FPM") {
					t.Fatalf("error %q does not name stream FPM and %q", err, want)
				}
			}
			// Interest retention without consumers: the server drops what nobody reads, sooner or later,
			// so only the configuration is compared there.
			after := info(t, env.JS, streams.StreamFPM)
			if !reflect.DeepEqual(after.Config, before) || !tc.noneKept && after.State.Msgs != 10 {
				t.Fatalf("stream changed: %+v, %d messages", after.Config, after.State.Msgs)
			}
		})
	}
}

// Components start together: each creates what is missing, none fails because another won the race.
func TestEnsureConcurrentStarts(t *testing.T) {
	env := emptyServer(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			cfg := streams.DefaultConfig()
			cfg.MaxAge = time.Duration(i+1) * time.Hour // the losers' flags differ from the winner's
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, errs[i] = streams.Ensure(ctx, env.JS, cfg, quiet)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Ensure %d: %v", i, err)
		}
	}
	for _, sc := range streams.DefaultConfig().All() {
		info(t, env.JS, sc.Name)
	}
}

func TestEnsureRejectsBadConfig(t *testing.T) {
	cfg := streams.DefaultConfig()
	cfg.DuplicateWindow = 0
	if _, err := streams.Ensure(context.Background(), nil, cfg, quiet); err == nil {
		t.Fatal("a zero duplicate window must be rejected before any server call")
	}
}

// A deployment whose FPM streams predate atomic batch publish (a single FPM stream, or shards) gets it
// turned on by a component's start and by `streams apply` without --force, keeping every message.
func TestAtomicPublishIsAnAdditiveChange(t *testing.T) {
	t.Parallel()
	for name, start := range map[string]func(context.Context, *natsservertest.Env, streams.Config) error{
		"component start": func(ctx context.Context, env *natsservertest.Env, c streams.Config) error {
			r, err := streams.Ensure(ctx, env.JS, c, quiet)
			if err == nil && !reflect.DeepEqual(r.Updated, r.Atomic) {
				err = errors.New("updated " + strings.Join(r.Updated, ",") + ", atomic " + strings.Join(r.Atomic, ","))
			}
			return err
		},
		"streams apply": func(ctx context.Context, env *natsservertest.Env, c streams.Config) error {
			p, err := streams.NewPlan(ctx, env.JS, c)
			if err != nil {
				return err
			}
			for _, ch := range p.Destructive() {
				return errors.New("destructive: " + ch.String())
			}
			return p.Execute(ctx, env.JS, false)
		},
	} {
		for _, shards := range []int{1, 2} {
			t.Run(name+"/shards "+string(rune('0'+shards)), func(t *testing.T) {
				t.Parallel()
				env := emptyServer(t)
				c := streams.DefaultConfig()
				c.FPMShards = shards
				var names []string
				for _, sc := range c.All() {
					if sc.AllowAtomicPublish {
						names = append(names, sc.Name)
					}
					sc.AllowAtomicPublish = false // as the previous version defined it
					if _, err := env.JS.CreateStream(t.Context(), sc); err != nil {
						t.Fatal(err)
					}
					if _, err := env.JS.Publish(t.Context(), sc.Subjects[0][:len(sc.Subjects[0])-1]+"dynamo.backend.w.0", []byte("{}")); err != nil {
						t.Fatal(err)
					}
				}
				if len(names) != shards {
					t.Fatalf("streams allowing atomic publish %v, want the %d FPM stream(s)", names, shards)
				}
				if err := start(t.Context(), env, c); err != nil {
					t.Fatal(err)
				}
				for _, sc := range c.All() {
					got := info(t, env.JS, sc.Name)
					if got.Config.AllowAtomicPublish != sc.AllowAtomicPublish || got.State.Msgs != 1 {
						t.Fatalf("%s: allow_atomic %v (want %v), %d messages (want the 1 stored)", sc.Name,
							got.Config.AllowAtomicPublish, sc.AllowAtomicPublish, got.State.Msgs)
					}
				}
				r, err := streams.Ensure(t.Context(), env.JS, c, quiet)
				if err != nil || len(r.Updated) != 0 || len(r.Differences) != 0 || !reflect.DeepEqual(r.Atomic, names) {
					t.Fatalf("second start: %+v, %v", r, err)
				}
			})
		}
	}
}
