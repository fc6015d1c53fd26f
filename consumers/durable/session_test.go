package durable

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// unacked is the number of delivered messages not yet acknowledged (done or not).
func (s *session) unacked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q) - s.head
}

func testSession() *session {
	return newSession(&Runner{wakeCh: make(chan struct{}, 1)}, context.Background(), 0)
}

// deliver adds the message with delivery number n (kept in StreamSeq) and returns its index.
func deliver(s *session, n int) uint64 {
	return s.add(&Msg{StreamSeq: uint64(n)}, time.Time{})
}

// cumulativeAck is the delivery number of the message a cumulative ack pass acknowledges (-1: none).
func cumulativeAck(t testing.TB, s *session) int {
	t.Helper()
	acks := s.ackable(true)
	switch len(acks) {
	case 0:
		return -1
	case 1:
		return int(acks[0].StreamSeq)
	}
	t.Fatalf("a cumulative ack pass acknowledged %d messages, want at most one", len(acks))
	return -1
}

func TestSessionAcksTheEndOfTheDonePrefix(t *testing.T) {
	t.Parallel()
	type step struct {
		done []int // delivery numbers marked done before the ack pass
		want int   // message acknowledged by the pass (-1: none)
	}
	for name, tc := range map[string]struct {
		n     int
		steps []step
	}{
		"in order":                     {5, []step{{[]int{0, 1}, 1}, {[]int{2, 3, 4}, 4}, {nil, -1}}},
		"a held message holds back":    {5, []step{{[]int{1, 2, 3}, -1}, {[]int{0}, 3}, {[]int{4}, 4}}},
		"the last one alone":           {3, []step{{[]int{2}, -1}, {[]int{1}, -1}, {[]int{0}, 2}}},
		"done twice and after the ack": {3, []step{{[]int{0, 0}, 0}, {[]int{0, 1}, 1}, {[]int{1}, -1}}},
		"nothing delivered":            {0, []step{{nil, -1}}},
	} {
		t.Run(name, func(t *testing.T) {
			s := testSession()
			for i := range tc.n {
				if got := deliver(s, i); got != uint64(i) {
					t.Fatalf("add %d: index %d", i, got)
				}
			}
			for i, st := range tc.steps {
				for _, d := range st.done {
					s.done(uint64(d))
				}
				if got := cumulativeAck(t, s); got != st.want {
					t.Fatalf("step %d: acked %d, want %d", i, got, st.want)
				}
			}
		})
	}
}

// TestSessionNeverAcksPastAHeldMessage marks 20,000 interleaved deliveries done in random order and
// checks after every step that the cumulative ack covers exactly the done prefix (across compactions).
func TestSessionNeverAcksPastAHeldMessage(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		s := testSession()
		const n = 20000
		isDone := make([]bool, n)
		delivered, prefix, lastAck := 0, 0, -1
		var open []int
		for prefix < n {
			// deliver a few, then mark a random open one done
			for k := r.IntN(8); k > 0 && delivered < n; k-- {
				if got := deliver(s, delivered); got != uint64(delivered) {
					t.Fatalf("seed %d: delivery %d got index %d", seed, delivered, got)
				}
				open = append(open, delivered)
				delivered++
			}
			if len(open) == 0 {
				continue
			}
			i := r.IntN(len(open))
			d := open[i]
			open = append(open[:i], open[i+1:]...)
			isDone[d] = true
			s.done(uint64(d))
			for prefix < delivered && isDone[prefix] {
				prefix++
			}
			got := cumulativeAck(t, s)
			switch {
			case prefix-1 > lastAck && got != prefix-1:
				t.Fatalf("seed %d: acked %d, want %d (the done prefix)", seed, got, prefix-1)
			case prefix-1 == lastAck && got != -1:
				t.Fatalf("seed %d: acked %d with nothing new done", seed, got)
			}
			lastAck = prefix - 1
			if s.unacked() != delivered-prefix {
				t.Fatalf("seed %d: %d unacked, want %d", seed, s.unacked(), delivered-prefix)
			}
		}
	}
}
