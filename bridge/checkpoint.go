package bridge

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams"
)

const (
	// ackCheckpointInterval is how often the changed ack records are written: what a crash of the
	// bridge itself leaves unchecked.
	ackCheckpointInterval = time.Second
	// checkpointOpTimeout bounds one record write.
	checkpointOpTimeout = 5 * time.Second
)

// checkpointer writes ack records to streams.BucketBridgeAcks on its own goroutine, so the publisher
// never waits on the bucket. The publisher hands it the records changed since the last hand-over
// (offer); a hand-over that finds the previous one still being written is refused and the records
// stay dirty for the next one. Run starts it after the check at start and stops it (stop: the final
// records are written, each bounded by checkpointOpTimeout) after the publisher has exited.
type checkpointer struct {
	b    *Bridge
	kv   jetstream.KeyValue
	in   chan []ackRecord // capacity 1
	done chan struct{}
}

func startCheckpointer(b *Bridge, kv jetstream.KeyValue) *checkpointer {
	c := &checkpointer{b: b, kv: kv, in: make(chan []ackRecord, 1), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *checkpointer) run() {
	defer close(c.done)
	for recs := range c.in {
		c.write(recs)
	}
}

// write puts each record; a failure is logged and counted, and the record is written again with its
// key's next change.
func (c *checkpointer) write(recs []ackRecord) {
	for i := range recs {
		body, err := json.Marshal(&recs[i])
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), checkpointOpTimeout)
			_, err = c.kv.Put(ctx, streams.BridgeAckKey(recs[i].Key), body)
			cancel()
		}
		if err != nil {
			c.b.metrics.checkpointErrors.Inc()
			c.b.log.Warn("ack record not written; lost_after_ack checks see the previous one", "key", recs[i].Key.String(), "error", err)
		}
	}
}

// offer hands the ledger's changed records over unless a write is still under way.
func (c *checkpointer) offer(l *ledger) {
	if len(l.dirty) == 0 || len(c.in) > 0 {
		return
	}
	c.in <- l.snapshot(c.b.cfg.BridgeID, c.b.now().UnixMilli())
}

// stop writes the ledger's last changes and waits for the writer to finish.
func (c *checkpointer) stop(l *ledger) {
	if recs := l.snapshot(c.b.cfg.BridgeID, c.b.now().UnixMilli()); len(recs) > 0 {
		c.in <- recs // the writer drains the channel before it exits
	}
	close(c.in)
	<-c.done
}
