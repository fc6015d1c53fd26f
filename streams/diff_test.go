package streams_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

func TestDiff(t *testing.T) {
	base := streams.DefaultConfig().FPMStream() // 168h, 10 GiB, file, 1 replica, 30 s window
	with := func(f func(*jetstream.StreamConfig)) jetstream.StreamConfig {
		sc := base
		sc.Subjects = append([]string(nil), base.Subjects...)
		f(&sc)
		return sc
	}
	ch := func(setting, current, wanted string, destructive bool) streams.Change {
		return streams.Change{Stream: streams.StreamFPM, Setting: setting, Current: current, Wanted: wanted, Destructive: destructive}
	}
	tests := map[string]struct {
		current, wanted jetstream.StreamConfig
		want            []streams.Change
	}{
		"identical": {current: base, wanted: base},
		"server spellings of the same settings": {
			current: with(func(sc *jetstream.StreamConfig) {
				sc.MaxMsgs, sc.MaxMsgsPerSubject, sc.MaxMsgSize, sc.MaxConsumers, sc.Replicas = 0, -1, 0, 0, 0
			}),
			wanted: with(func(sc *jetstream.StreamConfig) { sc.MaxMsgs, sc.MaxMsgSize, sc.MaxConsumers = -1, -1, -1 }),
		},
		"no duplicate window is the server's 2 minutes": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Duplicates = 2 * time.Minute }),
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.Duplicates = 0 }),
		},
		"subjects compared as a set": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Subjects = []string{"b.>", "fpm.>"} }),
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.Subjects = []string{"fpm.>", "b.>", "fpm.>"} }),
		},
		"lower max_bytes deletes": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxBytes = 2_000_000 }),
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.MaxBytes = 100_000 }),
			want:    []streams.Change{ch("max_bytes", "2000000", "100000", true)},
		},
		"higher max_bytes keeps": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxBytes = 2_000_000 }),
			wanted:  base,
			want:    []streams.Change{ch("max_bytes", "2000000", "10737418240", false)},
		},
		"a limit on an unlimited stream deletes": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxBytes, sc.MaxAge = -1, 0 }),
			wanted:  base,
			want: []streams.Change{ch("max_bytes", "unlimited", "10737418240", true),
				ch("max_age", "unlimited", "168h0m0s", true)},
		},
		"lifting limits keeps": {
			current: base,
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.MaxBytes, sc.MaxAge = -1, 0 }),
			want: []streams.Change{ch("max_bytes", "10737418240", "unlimited", false),
				ch("max_age", "168h0m0s", "unlimited", false)},
		},
		"shorter max_age deletes, longer keeps": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxAge = time.Hour }),
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.MaxAge = 10 * time.Minute }),
			want:    []streams.Change{ch("max_age", "1h0m0s", "10m0s", true)},
		},
		"longer max_age keeps": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxAge = time.Hour }),
			wanted:  base,
			want:    []streams.Change{ch("max_age", "1h0m0s", "168h0m0s", false)},
		},
		"operator's message limits are lifted without loss, lowered with loss": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxMsgs, sc.MaxMsgsPerSubject = 5000, 100 }),
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.MaxMsgs, sc.MaxMsgsPerSubject = -1, 10 }),
			want: []streams.Change{ch("max_msgs", "5000", "unlimited", false),
				ch("max_msgs_per_subject", "100", "10", true)},
		},
		"smaller max_msg_size refuses what is accepted today": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = -1 }),
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.MaxMsgSize = 1 << 20 }),
			want:    []streams.Change{ch("max_msg_size", "unlimited", "1048576", true)},
		},
		"storage change either way": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Storage = jetstream.MemoryStorage }),
			wanted:  base,
			want:    []streams.Change{ch("storage", "memory", "file", true)},
		},
		"fewer replicas": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Replicas = 3 }),
			wanted:  base,
			want:    []streams.Change{ch("num_replicas", "3", "1", true)},
		},
		"more replicas": {
			current: base,
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.Replicas = 3 }),
			want:    []streams.Change{ch("num_replicas", "1", "3", false)},
		},
		"discard new to old starts deleting a full stream": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Discard = jetstream.DiscardNew }),
			wanted:  base,
			want:    []streams.Change{ch("discard", "new", "old", true)},
		},
		"discard old to new keeps": {
			current: base,
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.Discard = jetstream.DiscardNew }),
			want:    []streams.Change{ch("discard", "old", "new", false)},
		},
		"interest retention to limits keeps": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Retention = jetstream.InterestPolicy }),
			wanted:  base,
			want:    []streams.Change{ch("retention", "interest", "limits", false)},
		},
		"limits to interest retention deletes acked messages": {
			current: base,
			wanted:  with(func(sc *jetstream.StreamConfig) { sc.Retention = jetstream.InterestPolicy }),
			want:    []streams.Change{ch("retention", "limits", "interest", true)},
		},
		"work-queue retention cannot be changed in place": {
			current: with(func(sc *jetstream.StreamConfig) { sc.Retention = jetstream.WorkQueuePolicy }),
			wanted:  base,
			want:    []streams.Change{ch("retention", "workqueue", "limits", true)},
		},
		"settings that never lose data": {
			current: with(func(sc *jetstream.StreamConfig) {
				sc.Subjects, sc.Duplicates, sc.AllowDirect, sc.MaxConsumers = []string{"fpm.dynamo.>"}, 2*time.Minute, false, 8
			}),
			wanted: base,
			want: []streams.Change{ch("subjects", "fpm.dynamo.>", "fpm.>", false),
				ch("max_consumers", "8", "unlimited", false),
				ch("duplicate_window", "2m0s", "30s", false),
				ch("allow_direct", "false", "true", false)},
		},
		"settings fpmbus does not define are not compared": {
			current: with(func(sc *jetstream.StreamConfig) {
				sc.Description, sc.Compression, sc.Metadata = "operator's", jetstream.S2Compression, map[string]string{"team": "infra"}
			}),
			wanted: base,
		},
		"an operator's 2 MB / 1 h stream against default flags": {
			current: with(func(sc *jetstream.StreamConfig) { sc.MaxBytes, sc.MaxAge = 2_000_000, time.Hour }),
			wanted:  base,
			want: []streams.Change{ch("max_bytes", "2000000", "10737418240", false),
				ch("max_age", "1h0m0s", "168h0m0s", false)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := streams.Diff(tc.current, tc.wanted)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Diff:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestChangeString(t *testing.T) {
	c := streams.Change{Stream: "FPM", Setting: "max_bytes", Current: "2000000", Wanted: "100000", Destructive: true}
	if got, want := c.String(), "FPM max_bytes 2000000 -> 100000"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}
