package partition

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := FPMConfig("trace").Validate(); err != nil {
		t.Fatalf("FPMConfig: %v", err)
	}
	tests := map[string]struct {
		mod  func(*Config)
		want string
	}{
		"no stream":          {func(c *Config) { c.Stream = "" }, "stream"},
		"group with dot":     {func(c *Config) { c.Group = "a.b" }, "group"},
		"partitions":         {func(c *Config) { c.Partitions = MaxPartitions + 1 }, "partitions"},
		"no filter":          {func(c *Config) { c.Filters = nil }, "no filter"},
		"key token range":    {func(c *Config) { c.Filters[0].KeyTokens = []int{5} }, "key token 5"},
		"key token repeated": {func(c *Config) { c.Filters[0].KeyTokens = []int{1, 1} }, "key token 1"},
		"gt not last":        {func(c *Config) { c.Filters[0].Subject = "fpm.>.x" }, "must be the last"},
		"empty token":        {func(c *Config) { c.Filters[0].Subject = "fpm..x" }, "empty token"},
		"overlap": {func(c *Config) {
			c.Filters = append(c.Filters, Filter{Subject: "fpm.dynamo.>"})
		}, "overlap"},
		"pinned ttl":    {func(c *Config) { c.PinnedTTL = time.Second }, "pinned TTL"},
		"ack wait":      {func(c *Config) { c.AckWait = time.Millisecond }, "ack wait"},
		"batch too big": {func(c *Config) { c.MaxAckPending = 10; c.Batch = 11 }, "batch"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := FPMConfig("trace")
			c.Filters = slices.Clone(c.Filters)
			tc.mod(&c)
			err := c.Validate()
			if !errors.Is(err, errInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an ErrInvalidConfig naming %q", err, tc.want)
			}
		})
	}
	// Zero values take the defaults.
	if err := (Config{Stream: "FPM", Group: "g", Filters: []Filter{{Subject: "fpm.>"}}}).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
}

func TestConsumerConfigAndNames(t *testing.T) {
	t.Parallel()
	c := FPMConfig("trace")
	cc := c.ConsumerConfig(3)
	if cc.Durable != "trace-3" || cc.FilterSubject != "3.>" || cc.DeliverSubject != "_FPMBUS.unowned.FPM.trace-3" ||
		!cc.FlowControl || cc.IdleHeartbeat != DefaultPinnedTTL/5 || cc.AckPolicy != jetstream.AckExplicitPolicy || cc.MaxDeliver != -1 ||
		len(cc.PriorityGroups) != 0 {
		t.Fatalf("partition consumer: %+v", cc)
	}
	if got := c.PartitionStream(); got != "FPM_PART_trace" {
		t.Fatalf("partition stream %q", got)
	}
	if got, want := c.transformDest(c.Filters[0]), "{{partition(16,1,2,3,4)}}.fpm.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}"; got != want {
		t.Fatalf("transform %q, want %q", got, want)
	}
	c.Partitions = 1
	cc = c.ConsumerConfig(0)
	if cc.Durable != "trace" || cc.FilterSubject != "fpm.*.*.*.*" || c.PartitionStream() != "" || c.ConsumerStream() != "FPM" {
		t.Fatalf("single-partition consumer: %+v on %q", cc, c.ConsumerStream())
	}
}

func TestAssignBalancedAndStable(t *testing.T) {
	t.Parallel()
	members := []string{"a", "b", "c"}
	got := assign(members, 16)
	seen := map[int]string{}
	for id, ps := range got {
		if len(ps) > 6 {
			t.Errorf("%s gets %d partitions, more than ceil(16/3)", id, len(ps))
		}
		for _, p := range ps {
			if o, ok := seen[p]; ok {
				t.Errorf("partition %d given to %s and %s", p, o, id)
			}
			seen[p] = id
		}
	}
	if len(seen) != 16 {
		t.Fatalf("%d partitions assigned, want 16: %v", len(seen), got)
	}
	// A fourth member takes only partitions it gets; the others keep most of theirs.
	got4 := assign(append(members, "d"), 16)
	moved := 0
	for id, ps := range got4 {
		for _, p := range ps {
			if seen[p] != id {
				moved++
			}
		}
	}
	if moved > 8 {
		t.Errorf("adding a member moved %d of 16 partitions", moved)
	}
	if !equalAssign(assign([]string{"b", "a"}, 5), assign([]string{"b", "a"}, 5)) {
		t.Fatal("assignment is not deterministic")
	}
	if len(assign(nil, 4)) != 0 {
		t.Fatal("no member, no assignment")
	}
}

func equalAssign(a, b map[string][]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// A group joined again with another PinnedTTL (an operator changing --pinned-ttl between runs) keeps
// working: the server cannot change a push consumer's idle heartbeat, so the declared one is kept.
func TestJoinAgainWithAnotherPinnedTTL(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := testConfig("ttl-change", 2)
	if _, err := Join(ctx, env.JS, cfg, WithLogger(testLogger())); err != nil {
		t.Fatal(err)
	}
	cfg.PinnedTTL = 4 * MinPinnedTTL
	cfg.AckWait = 45 * time.Second
	if _, err := Join(ctx, env.JS, cfg, WithLogger(testLogger())); err != nil {
		t.Fatalf("join with another pinned TTL: %v", err)
	}
	c, err := env.JS.PushConsumer(ctx, cfg.PartitionStream(), cfg.ConsumerName(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config; got.AckWait != 45*time.Second || got.IdleHeartbeat != time.Second /* the first join's: max(PinnedTTL/5, 1 s) */ {
		t.Fatalf("consumer after the second join: ack wait %v, heartbeat %v", got.AckWait, got.IdleHeartbeat)
	}
}
