package partition

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
)

// TestServerPushConsumerBehaviour records, on the real embedded server, the facts the ownership
// design rests on (see the package comment). If a server upgrade changes one of them, this test says
// which:
//
//  1. a push consumer delivers nothing while nobody subscribes to its deliver subject;
//  2. it reports PushBound while its subject has a subscriber, and not once that subscriber's
//     connection is closed;
//  3. its deliver subject cannot be changed while that subject has a subscriber (the server answers
//     10013, consumer name in use), and after it is changed the old subject gets nothing more;
//  4. a reset to the ack floor makes the new subject get every unacked message first, in stream
//     order, with consecutive delivery numbers.
func TestServerPushConsumerBehaviour(t *testing.T) {
	t.Parallel()
	env := natsservertest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "EXP", Subjects: []string{"exp.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := env.JS.Publish(ctx, "exp.k", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	cfg := jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: 5,
		DeliverSubject: "_FPMBUS.unowned.EXP.c", FlowControl: true, IdleHeartbeat: time.Second,
	}
	stream, err := env.JS.Stream(ctx, "EXP")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.CreatePushConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	info := func() *jetstream.ConsumerInfo {
		c, err := stream.PushConsumer(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		return c.CachedInfo()
	}
	// 1.
	time.Sleep(200 * time.Millisecond)
	if i := info(); i.Delivered.Stream != 0 || i.PushBound {
		t.Fatalf("without a subscriber: delivered %d, bound %v", i.Delivered.Stream, i.PushBound)
	}
	// take points the consumer at a subject of conn nc and returns what arrives there.
	type delivery struct{ stream, consumer uint64 }
	take := func(nc *nats.Conn, reset bool) (chan delivery, *nats.Subscription) {
		subj := nc.NewInbox()
		ch := make(chan delivery, 100)
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			if m.Header.Get("Status") != "" {
				if m.Reply != "" {
					_ = m.Respond(nil) // flow control
				}
				return
			}
			md, err := m.Metadata()
			if err != nil {
				t.Error(err)
				return
			}
			ch <- delivery{md.Sequence.Stream, md.Sequence.Consumer}
			if md.Sequence.Stream <= 2 {
				_ = m.Ack()
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.DeliverSubject = subj
		if _, err := stream.UpdatePushConsumer(ctx, c); err != nil {
			t.Fatal(err)
		}
		if reset {
			if _, err := stream.ResetConsumer(ctx, "c"); err != nil {
				t.Fatal(err)
			}
		}
		return ch, sub
	}
	recv := func(ch chan delivery, n int) []delivery {
		var out []delivery
		for len(out) < n {
			select {
			case d := <-ch:
				out = append(out, d)
			case <-time.After(5 * time.Second):
				t.Fatalf("got %v, want %d deliveries", out, n)
			}
		}
		return out
	}
	ncA, _ := connect(t, env)
	chA, _ := take(ncA, false)
	if got := recv(chA, 5); got[0].stream != 1 || got[4].stream != 5 { // 1, 2 acked; 3..5 held
		t.Fatalf("A got %v", got)
	}
	// 2.
	if !info().PushBound {
		t.Fatal("not bound while A subscribes")
	}
	ncA.Close()
	deadline := time.Now().Add(5 * time.Second)
	for info().PushBound {
		if time.Now().After(deadline) {
			t.Fatal("still bound 5 s after A's connection closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 3. and 4.
	ncB, _ := connect(t, env)
	chB, subB := take(ncB, true)
	got := recv(chB, 5)
	for i, d := range got {
		if d.stream != uint64(3+i) || d.consumer != got[0].consumer+uint64(i) {
			t.Fatalf("B after the reset got %v, want streams 3.. with consecutive delivery numbers", got)
		}
	}
	c := cfg
	c.DeliverSubject = "_FPMBUS.elsewhere"
	var apiErr *jetstream.APIError
	if _, err := stream.UpdatePushConsumer(ctx, c); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10013 {
		t.Fatalf("moving a subject that has a subscriber: %v, want error 10013", err)
	}
	if err := subB.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for len(chB) > 0 { // what B got before it unsubscribed
		<-chB
	}
	ncC, _ := connect(t, env)
	chC, _ := take(ncC, true)
	recv(chC, 1)
	select {
	case d := <-chB:
		t.Fatalf("B got stream %d after it unsubscribed", d.stream)
	case <-time.After(300 * time.Millisecond):
	}
}
