package streams

import (
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the bridge's records and events have in common. Its KV buckets (BucketBridgeAcks,
// BucketBridgeRuns) hold one record per publisher key; its events on FPM_EVENTS (drop markers,
// lost_after_ack gap events) are JSON bodies on a publisher's subject that say which bridge and which
// publisher run they are about.

// bridgeBucket is the definition of one of the bridge's per-publisher-key buckets: one value per key,
// kept as long as the FPM stream keeps messages (a record older than that describes nothing the stream
// could still hold), storage and replicas from c.
func (c Config) bridgeBucket(name, description string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      name,
		Description: description,
		History:     1,
		TTL:         c.MaxAge,
		Storage:     c.Storage,
		Replicas:    c.Replicas,
	}
}

// bridgeEventMsg is a bridge event's message: subject, event as its JSON body (plain strings and
// integers: marshalling cannot fail), and the headers Nats-Msg-Id msgID (so that publishing the event
// twice, or two bridges publishing it, stores it once), Fpm-Event eventType, Fpm-Bridge and Fpm-Epoch.
func bridgeEventMsg(subject, msgID, eventType, bridge string, epoch int64, event any) *nats.Msg {
	body, _ := json.Marshal(event)
	h := make(nats.Header, 4)
	h.Set(HeaderMsgID, msgID)
	h.Set(HeaderEventType, eventType)
	h.Set(HeaderBridge, bridge)
	h.Set(HeaderEpoch, strconv.FormatInt(epoch, 10))
	return &nats.Msg{Subject: subject, Header: h, Data: body}
}
