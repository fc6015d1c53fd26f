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

	"github.com/fpmbus/fpmbus/streams"
)

// streamPrefix selects fpmbus's streams: FPM, its shards FPM_<n>, FPM_EVENTS, FPM_BENCH and the
// partition streams FPM_PART_<group> and FPM_BENCH_PART_<group>.
const streamPrefix = "FPM"

// baseStreams are the streams every component's user may read the info of.
var baseStreams = []string{streams.StreamFPM, streams.StreamEvents, streams.StreamBench}

// ownJetStream reads what a least-privileged component may: the base streams' infos and its own
// consumers'. A stream or consumer that does not exist (yet, or under sharding) is left out; any other
// refusal leaves an Error, never a failure.
func ownJetStream(ctx context.Context, js jetstream.JetStream, refs []ConsumerRef) *JetStream {
	out := &JetStream{Consumers: []jetStreamConsumer{}}
	var errs []string
	for _, name := range baseStreams {
		st, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("stream %s: %v", name, err))
			continue
		}
		out.streams = append(out.streams, policyOf(st.CachedInfo()))
	}
	for _, r := range refs {
		for _, d := range r.Durables {
			info, err := consumerInfo(ctx, js, d)
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Sprintf("consumer %s on %s: %v", d.Name, d.Stream, err))
				continue
			}
			out.Consumers = append(out.Consumers, consumerOf(d.Stream, info, r.Component))
		}
	}
	out.Error = strings.Join(errs, "; ")
	return out
}

// consumerInfo is d's ConsumerInfo (one CONSUMER.INFO request), whether it is a pull or a push consumer
// (the partition groups' are push consumers).
func consumerInfo(ctx context.Context, js jetstream.JetStream, d Durable) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(ctx, d.Stream, d.Name)
	if errors.Is(err, jetstream.ErrNotPullConsumer) {
		pc, perr := js.PushConsumer(ctx, d.Stream, d.Name)
		if perr != nil {
			return nil, perr
		}
		return pc.CachedInfo(), nil
	}
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

func policyOf(info *jetstream.StreamInfo) streamPolicy {
	c := info.Config
	return streamPolicy{Name: c.Name, Storage: strings.ToLower(c.Storage.String()), Replicas: c.Replicas,
		MaxBytes: c.MaxBytes, MaxAgeSeconds: c.MaxAge.Seconds(), Discard: discardName(c.Discard),
		DuplicatesSeconds: c.Duplicates.Seconds(), Messages: info.State.Msgs, Bytes: info.State.Bytes}
}

func consumerOf(stream string, ci *jetstream.ConsumerInfo, component string) jetStreamConsumer {
	return jetStreamConsumer{Stream: stream, Name: ci.Name, Component: component,
		Pending: ci.NumPending, AckPending: ci.NumAckPending, MaxAckPending: ci.Config.MaxAckPending,
		Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting}
}

// listJetStream lists the durable consumers and the policy of fpmbus's streams. A server that refuses
// or does not answer leaves an Error, never a failure.
func listJetStream(ctx context.Context, js jetstream.JetStream, refs []ConsumerRef) *JetStream {
	out := &JetStream{Consumers: []jetStreamConsumer{}}
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
		out.streams = append(out.streams, policyOf(info))
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
			out.Consumers = append(out.Consumers, consumerOf(c.Name, ci, ownerOf(refs, ci.Name)))
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
