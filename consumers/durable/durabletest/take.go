package durabletest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Take receives n messages of consumer cc on stream without acking them, as an instance that is
// killed before its acks leave, and returns them (a test may still ack them). A pull consumer is
// fetched from; a partition group's push consumer is pointed at a subject of Take's own while it
// receives, and left with that subject and no subscriber (and no owner record), so that the group's
// next member takes it at once. The consumer is created or updated to cc first.
func Take(t testing.TB, js jetstream.JetStream, stream string, cc jetstream.ConsumerConfig, n int) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []jetstream.Msg
	if cc.DeliverSubject == "" {
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, cc)
		if err != nil {
			t.Fatal(err)
		}
		for len(out) < n {
			b, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for m := range b.Messages() {
				out = append(out, m)
			}
			if b.Error() != nil {
				t.Fatal(b.Error())
			}
		}
		return out
	}
	cc.DeliverSubject = js.Conn().NewInbox()
	cons, err := js.CreateOrUpdatePushConsumer(ctx, stream, cc)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan jetstream.Msg, n)
	cctx, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case got <- m:
		default: // beyond n: left unacked
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cctx.Stop()
	for len(out) < n {
		select {
		case m := <-got:
			out = append(out, m)
		case <-ctx.Done():
			t.Fatalf("took %d of %d messages from %s/%s", len(out), n, stream, cc.Durable)
		}
	}
	return out
}
