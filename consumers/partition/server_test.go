package partition

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// TestServerPinnedClientBehaviour records, on the real embedded server, the facts the design rests on
// (see the package comment). If a server upgrade changes one of them, this test says which.
func TestServerPinnedClientBehaviour(t *testing.T) {
	env := streamstest.Start(t)
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
	const ttl = 2 * time.Second
	if _, err := env.JS.CreateOrUpdateConsumer(ctx, "EXP", jetstream.ConsumerConfig{
		Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
		PriorityGroups: []string{PriorityGroup}, PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: ttl,
	}); err != nil {
		t.Fatal(err)
	}
	stream, err := env.JS.Stream(ctx, "EXP")
	if err != nil {
		t.Fatal(err)
	}
	client := func() (func(), jetstream.Consumer) {
		nc, js := connect(t, env)
		c, err := js.Consumer(ctx, "EXP", "c")
		if err != nil {
			t.Fatal(err)
		}
		return nc.Close, c
	}
	fetch := func(c jetstream.Consumer, n int, wait time.Duration) []uint64 {
		b, err := c.Fetch(n, jetstream.FetchPriorityGroup(PriorityGroup), jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for m := range b.Messages() {
			md, _ := m.Metadata()
			seqs = append(seqs, md.Sequence.Stream)
			if md.Sequence.Stream <= 2 {
				_ = m.Ack()
			}
		}
		return seqs
	}
	pin := func() string {
		c, err := stream.Consumer(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		i, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(i.PriorityGroups) == 0 {
			return ""
		}
		return i.PriorityGroups[0].PinnedClientID
	}

	// A takes 1..5, acks 1 and 2, and crashes (connection closed).
	closeA, a := client()
	if got := fetch(a, 5, time.Second); len(got) != 5 || got[0] != 1 {
		t.Fatalf("A got %v", got)
	}
	pinA := pin()
	closeA()
	time.Sleep(200 * time.Millisecond)
	// 1. Closing the pinned client's connection does not unpin: the pin lasts until PinnedTTL.
	if p := pin(); p != pinA || p == "" {
		t.Fatalf("pin after A closed = %q, want A's %q", p, pinA)
	}
	// 2. B is pinned only after PinnedTTL, and gets the newer messages 6.. first: A's unacked 3..5 wait
	// for AckWait. Order across owners is therefore NOT preserved by pinning alone.
	_, b := client()
	start := time.Now()
	got := fetch(b, 3, 2*ttl)
	took := time.Since(start)
	if len(got) != 3 || got[0] != 6 {
		t.Fatalf("B got %v, want 6,7,8 (the server's order without a reset)", got)
	}
	if took < ttl/2 {
		t.Fatalf("B pinned after %v: before PinnedTTL", took)
	}
	t.Logf("crash: pin kept after close; new client pinned after %v, got %v first", took, got)
	// 3. A reset to the ack floor makes the pinned client get 3,4,5,6,7,... in stream order at once,
	// and keeps the pin.
	pinB := pin()
	r, err := stream.ResetConsumer(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if r.ResetSeq != 3 || r.Delivered.Consumer != 0 {
		t.Fatalf("reset to %d, delivered %d; want 3 and 0", r.ResetSeq, r.Delivered.Consumer)
	}
	if p := pin(); p != pinB {
		t.Fatalf("reset changed the pin")
	}
	got = fetch(b, 5, time.Second)
	if want := []uint64{3, 4, 5, 6, 7}; !equal(got, want) {
		t.Fatalf("after reset B got %v, want %v", got, want)
	}
	// 4. Unpin moves the partition at once to a client already waiting.
	_, c := client()
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = stream.UnpinConsumer(context.Background(), "c", PriorityGroup)
	}()
	start = time.Now()
	got = fetch(c, 1, 2*ttl)
	if took := time.Since(start); len(got) != 1 || took > ttl/2 {
		t.Fatalf("after unpin C got %v after %v", got, took)
	}
	t.Logf("unpin: waiting client pinned %v after the request was queued (unpin at 300ms)", time.Since(start))
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
