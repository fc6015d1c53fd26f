package partition

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// An owner that dies (SIGKILL, a cut connection) or unsubscribes with a flow-control request in flight
// leaves its partition consumer stalled: the server sends nothing more until that request is answered,
// and it tells whoever subscribes next only in its idle heartbeats (Nats-Consumer-Stalled: <reply
// subject>). Neither moving the consumer's subject nor resetting it clears the stall. The next owner
// must answer it and then receive every message, in order.
func TestTakeoverAnswersAFlowControlStallLeftByTheDeadOwner(t *testing.T) {
	t.Parallel()
	for _, released := range []bool{false, true} {
		name := "crashed owner"
		if released {
			name = "released owner"
		}
		t.Run(name, func(t *testing.T) {
			env := natsservertest.Start(t)
			cfg := testConfig("fc-stall", 1)
			cfg.MaxAckPending = 20000
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			m, err := Join(ctx, env.JS, cfg, WithLogger(testLogger()))
			if err != nil {
				t.Fatal(err)
			}

			// The previous owner: subscribed to its subject, never answering flow control.
			ncDead, _ := connect(t, env)
			const dead = "_INBOX.owner-that-dies"
			fcAsked := make(chan struct{})
			var asked bool
			if _, err := ncDead.Subscribe(dead, func(msg *nats.Msg) {
				if msg.Header.Get("Status") == "100" && strings.Contains(msg.Header.Get("Description"), "FlowControl") && !asked {
					asked = true
					close(fcAsked)
				}
			}); err != nil {
				t.Fatal(err)
			}
			if err := ncDead.Flush(); err != nil {
				t.Fatal(err)
			}
			c, err := env.JS.PushConsumer(ctx, cfg.Stream, cfg.ConsumerName(0))
			if err != nil {
				t.Fatal(err)
			}
			cc := c.CachedInfo().Config
			cc.DeliverSubject = dead
			if _, err := env.JS.UpdatePushConsumer(ctx, cfg.Stream, cc); err != nil {
				t.Fatal(err)
			}
			rev, err := m.writeOwner(ctx, 0, ownerRecord{Member: "owner-that-dies", Deliver: dead}, 0)
			if err != nil {
				t.Fatal(err)
			}

			// Enough bytes that the server asks for flow control (past half its first window, 1 MiB).
			const keys, perKey = 4, 1000
			pad := strings.Repeat("p", 1024)
			for i := range perKey {
				for k := range keys {
					msg := nats.NewMsg(keySubject(k))
					msg.Data = []byte(strconv.Itoa(i))
					msg.Header.Set("Fpm-Test-Pad", pad)
					if _, err := env.JS.PublishMsgAsync(msg); err != nil {
						t.Fatal(err)
					}
				}
			}
			select {
			case <-env.JS.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
			select {
			case <-fcAsked:
			case <-time.After(10 * time.Second):
				t.Fatal("the server never asked the owner for flow control")
			}
			ncDead.Close() // gone without answering
			if released {
				if _, err := m.writeOwner(ctx, 0, ownerRecord{Member: "owner-that-dies", Released: true}, rev); err != nil {
					t.Fatal(err)
				}
			}

			rec := newRecorder(t, cfg)
			startMember(t, env, cfg, "next", rec)
			took := waitFor(t, cfg.PinnedTTL+15*time.Second, "the next owner to process every message",
				func() bool { return rec.total.Load() == keys*perKey })
			t.Logf("every message processed %v after the next owner started", took)
			rec.check(keys, perKey)
		})
	}
}
