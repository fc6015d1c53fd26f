package gaps

import (
	"math/rand/v2"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// seqMsg is a delivered message known only by its delivery number.
type seqMsg struct {
	jetstream.Msg
	n int
}

// pending is the number of delivered messages not yet acknowledged.
func (l *ackLog) pending() int { return len(l.q) - l.head }

func acked(m jetstream.Msg) int {
	if m == nil {
		return -1
	}
	return m.(seqMsg).n
}

func TestAckLogAcksTheEndOfTheDonePrefix(t *testing.T) {
	type step struct {
		done []int // delivery numbers marked done before advancing
		want int   // message acked by the advance (-1: none)
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
			var l ackLog
			for i := range tc.n {
				if got := l.add(seqMsg{n: i}); got != uint64(i) {
					t.Fatalf("add %d: index %d", i, got)
				}
			}
			for i, s := range tc.steps {
				for _, d := range s.done {
					l.done(uint64(d))
				}
				if got := acked(l.advance()); got != s.want {
					t.Fatalf("step %d: acked %d, want %d", i, got, s.want)
				}
			}
		})
	}
}

// TestAckLogNeverAcksPastAHeldMessage marks 20,000 interleaved deliveries done in random order and
// checks after every step that the ack covers exactly the done prefix (across compactions).
func TestAckLogNeverAcksPastAHeldMessage(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		var l ackLog
		const n = 20000
		isDone := make([]bool, n)
		delivered, prefix, lastAck := 0, 0, -1
		var open []int
		for prefix < n {
			// deliver a few, then mark a random open one done
			for k := r.IntN(8); k > 0 && delivered < n; k-- {
				if got := l.add(seqMsg{n: delivered}); got != uint64(delivered) {
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
			l.done(uint64(d))
			for prefix < delivered && isDone[prefix] {
				prefix++
			}
			m := l.advance()
			switch {
			case prefix-1 > lastAck && acked(m) != prefix-1:
				t.Fatalf("seed %d: acked %d, want %d (the done prefix)", seed, acked(m), prefix-1)
			case prefix-1 == lastAck && m != nil:
				t.Fatalf("seed %d: acked %d with nothing new done", seed, acked(m))
			}
			lastAck = prefix - 1
			if l.pending() != delivered-prefix {
				t.Fatalf("seed %d: %d pending, want %d", seed, l.pending(), delivered-prefix)
			}
		}
	}
}
