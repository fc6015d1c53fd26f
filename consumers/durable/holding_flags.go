package durable

import (
	"flag"
	"fmt"

	"github.com/fpmbus/fpmbus/internal/flagprefix"
)

// HoldingFlags are the group flags of a holding stage (the merger's --merge-…, the sealer's --seal-…),
// defined once here for both: --<stage>-durable, --<stage>-partitions, --<stage>-pinned-ttl,
// --<stage>-member-id, --<stage>-ack-wait and --<stage>-max-deliveries, named by the stage's
// flagprefix.Component. They write into the HoldingConfig they were registered on.
type HoldingFlags struct {
	h        *HoldingConfig
	cf       *flagprefix.Component
	stage    string
	memberID string
}

// HoldingRoles are the words a holding stage's flag help uses: its role ("merger"), what its
// partitions' keys say (" (keyed by run_id)", or "") and what it holds ("ranks").
type HoldingRoles struct {
	Role, Keyed, Held string
}

// RegisterFlags defines the group flags of stage ("merge", "seal") on fs through cf, with h's values
// as defaults (zero ones show the holding defaults; Durable shows defaultDurable).
func (h *HoldingConfig) RegisterFlags(fs *flag.FlagSet, cf *flagprefix.Component, stage, defaultDurable string, r HoldingRoles) *HoldingFlags {
	f := &HoldingFlags{h: h, cf: cf, stage: stage}
	n := func(name string) string { return cf.Name(stage + "-" + name) }
	if h.Durable == "" {
		h.Durable = defaultDurable
	}
	if h.Partitions == 0 {
		h.Partitions = DefaultHoldingPartitions
	}
	if h.PinnedTTL == 0 {
		h.PinnedTTL = DefaultPinnedTTL
	}
	if h.AckWait == 0 {
		h.AckWait = DefaultHoldingAckWait
	}
	fs.StringVar(&h.Durable, n("durable"), h.Durable, "the "+r.Role+"'s group: durable consumer name on FPM_BENCH (<name>-<p> on FPM_BENCH_PART_<name> with N > 1 partitions)")
	fs.IntVar(&h.Partitions, n("partitions"), h.Partitions, "partitions of the runs"+r.Keyed+" shared by the instances of "+cf.Flag(stage+"-durable")+
		" (fixed for the group's life; 1: one active "+r.Role+", the other instances hot standbys)")
	fs.DurationVar(&h.PinnedTTL, n("pinned-ttl"), h.PinnedTTL, fmt.Sprintf("how long a crashed instance keeps its partitions before another instance takes them over (%v to %v)", MinPinnedTTL, MaxPinnedTTL))
	fs.StringVar(&f.memberID, n("member-id"), "", "this instance's name in its group (default <host>-<pid>-<random>)")
	fs.DurationVar(&h.AckWait, n("ack-wait"), h.AckWait, "ack wait of the partition consumers (held "+r.Held+" are kept alive with in-progress acks)")
	fs.IntVar(&h.MaxDeliveries, n("max-deliveries"), h.MaxDeliveries, fmt.Sprintf("a message delivered this often, or whose partition was taken over this often after crashes without progress, is dead-lettered (0: %d)", holdingMaxDeliveries))
	return f
}

// Check reports, wrapped in sentinel and naming the flag, a partition count, pinned TTL or delivery
// bound of h (the parsed flags' HoldingConfig, or one derived from them) the group cannot take.
func (f *HoldingFlags) Check(h HoldingConfig, sentinel error) error {
	name := func(n string) string { return f.cf.Flag(f.stage + "-" + n) }
	switch {
	case h.Partitions < 1 || h.Partitions > MaxPartitions:
		return flagprefix.Invalid(sentinel, "%s %d: want 1 to %d", name("partitions"), h.Partitions, MaxPartitions)
	case h.PinnedTTL < MinPinnedTTL || h.PinnedTTL > MaxPinnedTTL:
		return flagprefix.Invalid(sentinel, "%s %v: want %v to %v", name("pinned-ttl"), h.PinnedTTL, MinPinnedTTL, MaxPinnedTTL)
	case h.MaxDeliveries < 0:
		return flagprefix.Invalid(sentinel, "%s %d: want 0 (the default) or more", name("max-deliveries"), h.MaxDeliveries)
	}
	return nil
}

// Options are the runner options the flags give: the member id when --<stage>-member-id was set.
func (f *HoldingFlags) Options() []Option {
	if f.memberID == "" {
		return nil
	}
	return []Option{WithMemberID(f.memberID)}
}
