package observe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// streamPrefix selects fpmbus's streams: FPM, its shards FPM_<n>, FPM_EVENTS, FPM_BENCH and the
// partition streams FPM_PART_<group> and FPM_BENCH_PART_<group>.
const streamPrefix = "FPM"

// readJetStream lists the durable consumers and the policy of fpmbus's streams. A server that refuses
// (a least-privileged user may not list streams) or does not answer leaves an Error, never a failure.
func readJetStream(ctx context.Context, js jetstream.JetStream, refs []ConsumerRef) *JetStream {
	out := &JetStream{Consumers: []JetStreamConsumer{}}
	var errs []string
	lister := js.ListStreams(ctx)
	var infos []*jetstream.StreamInfo
	for info := range lister.Info() {
		if strings.HasPrefix(info.Config.Name, streamPrefix) {
			infos = append(infos, info)
		}
	}
	if err := lister.Err(); err != nil {
		errs = append(errs, fmt.Sprintf("listing streams: %v", err))
	}
	slices.SortFunc(infos, func(a, b *jetstream.StreamInfo) int { return cmp.Compare(a.Config.Name, b.Config.Name) })
	for _, info := range infos {
		c := info.Config
		out.streams = append(out.streams, StreamPolicy{Name: c.Name, Storage: strings.ToLower(c.Storage.String()), Replicas: c.Replicas,
			MaxBytes: c.MaxBytes, MaxAgeSeconds: c.MaxAge.Seconds(), Discard: discardName(c.Discard),
			DuplicatesSeconds: c.Duplicates.Seconds(), Messages: info.State.Msgs, Bytes: info.State.Bytes})
		st, err := js.Stream(ctx, c.Name)
		if err != nil {
			errs = append(errs, fmt.Sprintf("stream %s: %v", c.Name, err))
			continue
		}
		cl := st.ListConsumers(ctx)
		for ci := range cl.Info() {
			if ci.Config.Durable == "" && ci.Config.InactiveThreshold > 0 {
				continue // an ephemeral reader (an ordered consumer, the nats CLI)
			}
			out.Consumers = append(out.Consumers, JetStreamConsumer{Stream: c.Name, Name: ci.Name, Component: ownerOf(refs, ci.Name),
				Pending: ci.NumPending, AckPending: ci.NumAckPending, MaxAckPending: ci.Config.MaxAckPending,
				Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting})
		}
		if err := cl.Err(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Sprintf("consumers of %s: %v", c.Name, err))
		}
	}
	out.Error = strings.Join(errs, "; ")
	return out
}

func discardName(d jetstream.DiscardPolicy) string {
	if d == jetstream.DiscardNew {
		return "new"
	}
	return "old"
}

// ownerOf is the component whose group names consumer name: the group itself or <group>-<partition>.
func ownerOf(refs []ConsumerRef, name string) string {
	for _, r := range refs {
		if r.Group == "" {
			continue
		}
		if name == r.Group {
			return r.Component
		}
		if rest, ok := strings.CutPrefix(name, r.Group+"-"); ok {
			if _, err := strconv.Atoi(rest); err == nil {
				return r.Component
			}
		}
	}
	return ""
}
