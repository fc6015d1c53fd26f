// Package durabletest measures a stage on the runner against the cheapest consumer of the same
// stream, for the stages' benchmarks: the same sides, the same steady-rate window and the same CPU
// accounting in every stage, so that their ratios compare. Only tests import it.
//
// A side is one way of consuming n pre-published messages on a consumer of its own: Bare (the
// cheapest consumer: fetch and ack cumulatively; or the same acks on the group's own push consumer,
// what partition ownership's delivery costs), a Runner with DoneAtOnce (the runner's own cost), or the stage itself (Run). Its Result is
// its steady rate: how fast its ack floor went from 10% to 90% of the messages (polled every 5 ms),
// which leaves out what sides do differently once (joining a group, the first pulls, the last flush,
// the graceful stop), and the process's CPU (an in-process server included) per message over that
// window.
//
// Environment: FPMBUS_BENCH_RECORDS (messages per side), FPMBUS_BENCH_ROUNDS (rounds, each side once
// per round), FPMBUS_BENCH_SIDES (comma-separated sides to run; the ratios of a side left out are
// meaningless), FPMBUS_BENCH_PROFILE=<dir> (a CPU profile per side and round, <dir>/<side>-<round>.prof;
// merge a side's rounds with `go tool pprof -top <dir>/<side>-*.prof`).
package durabletest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/consumers/durable"
)

// Records is FPMBUS_BENCH_RECORDS, else def.
func Records(def int) int { return envInt("FPMBUS_BENCH_RECORDS", def) }

// rounds is FPMBUS_BENCH_ROUNDS, else 5.
func rounds() int { return envInt("FPMBUS_BENCH_ROUNDS", 5) }

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// sideEnabled reports whether side runs (FPMBUS_BENCH_SIDES unset, or listing it).
func sideEnabled(side string) bool {
	list := os.Getenv("FPMBUS_BENCH_SIDES")
	return list == "" || slices.Contains(strings.Split(list, ","), side)
}

// profile profiles the process's CPU while one side runs, when FPMBUS_BENCH_PROFILE names a
// directory; call the returned stop when the side ends. Not with -cpuprofile, which holds the one
// CPU profile.
func profile(b *testing.B, side string, round int) (stop func()) {
	dir := os.Getenv("FPMBUS_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprint(side, "-", round, ".prof")))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Result is one side's steady rate (messages per second) and the process CPU per message over the
// same window, in microseconds.
type Result struct{ Rate, CPUUs float64 }

// DoneAtOnce is the cheapest durable.Consumer: every message is done as soon as it is handed, so what
// a Runner with it costs is the runner's own.
type DoneAtOnce struct{}

func (DoneAtOnce) Handle(_ context.Context, batch []*durable.Msg) error {
	for _, m := range batch {
		m.Done()
	}
	return nil
}
func (DoneAtOnce) Tick(context.Context, time.Time) error { return nil }
func (DoneAtOnce) Close(context.Context) error           { return nil }

// Run runs run until consumer name on stream has acknowledged all n messages, stops it and returns
// its steady Result.
func Run(b *testing.B, js jetstream.JetStream, stream, name string, n int, run func(context.Context) error) Result {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	res := steadyRate(b, js, stream, name, n, done)
	waitAckFloor(b, js, stream, name, uint64(n))
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return res
}

// Bare consumes n messages with the cheapest consumer on group's first partition consumer settings
// (its durable name, filter and ack policy) and returns its steady Result: a pull consumer that
// fetches group.Batch at a time and acks every 1000 messages and the last, and does nothing else.
// pushed instead declares the group's own push consumer (flow control, idle heartbeats) pointed at a
// subject of this side's and acks the same way: what partition ownership's delivery costs.
func Bare(b *testing.B, js jetstream.JetStream, group durable.GroupConfig, n int, pushed bool) Result {
	ctx := context.Background()
	cc := group.ConsumerConfig(0)
	stream := group.ConsumerStream()
	done := make(chan error, 1)
	i := 0
	ack := func(m jetstream.Msg) bool {
		i++
		if i%1000 == 0 || i == n {
			if err := m.Ack(); err != nil {
				done <- err
				return false
			}
		}
		return i < n
	}
	if pushed {
		cc.DeliverSubject = js.Conn().NewInbox()
		cons, err := js.CreateOrUpdatePushConsumer(ctx, stream, cc)
		if err != nil {
			b.Fatal(err)
		}
		cctx, err := cons.Consume(func(m jetstream.Msg) { ack(m) })
		if err != nil {
			b.Fatal(err)
		}
		defer cctx.Stop()
	} else {
		cc.DeliverSubject, cc.FlowControl, cc.IdleHeartbeat = "", false, 0
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, cc)
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(group.Batch))
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer it.Stop()
			for {
				m, err := it.Next()
				if err != nil {
					done <- err
					return
				}
				if !ack(m) {
					return
				}
			}
		}()
	}
	res := steadyRate(b, js, stream, cc.Durable, n, done)
	waitAckFloor(b, js, stream, cc.Durable, uint64(n))
	return res
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// consumerInfoOf returns a function that reads consumer name's info (nil until the consumer exists).
func consumerInfoOf(js jetstream.JetStream, stream, name string) func() *jetstream.ConsumerInfo {
	// One server request a poll, whichever kind the consumer is (the first poll finds out).
	var push jetstream.PushConsumer
	var pull jetstream.Consumer
	return func() *jetstream.ConsumerInfo {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		switch {
		case push != nil:
			ci, err := push.Info(ctx)
			if err != nil {
				return nil
			}
			return ci
		case pull != nil:
			ci, err := pull.Info(ctx)
			if err != nil {
				return nil
			}
			return ci
		}
		if c, err := js.PushConsumer(ctx, stream, name); err == nil {
			push = c
			return c.CachedInfo()
		}
		if c, err := js.Consumer(ctx, stream, name); err == nil {
			pull = c
			return c.CachedInfo()
		}
		return nil
	}
}

// steadyRate polls consumer name's ack floor every 5 ms until it reaches 90% of n and returns the
// rate at which it went from 10% to 90%, with the process CPU per message over that window.
func steadyRate(b *testing.B, js jetstream.JetStream, stream, name string, n int, done <-chan error) Result {
	lo, hi := uint64(n)/10, uint64(n)*9/10
	var tLo time.Time
	var floorLo uint64
	var cpuLo time.Duration
	info := consumerInfoOf(js, stream, name)
	for {
		if ci := info(); ci != nil {
			now, cpu, floor := time.Now(), cpuTime(), ci.AckFloor.Stream
			if tLo.IsZero() && floor >= lo {
				tLo, floorLo, cpuLo = now, floor, cpu
			}
			if !tLo.IsZero() && floor >= hi {
				msgs := float64(floor - floorLo)
				return Result{Rate: msgs / now.Sub(tLo).Seconds(), CPUUs: float64((cpu - cpuLo).Microseconds()) / msgs}
			}
		}
		select {
		case err := <-done:
			b.Fatalf("%s ended before acknowledging 90%%: %v", name, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitAckFloor polls until the consumer's ack floor reaches seq (at most 5 minutes).
func waitAckFloor(b *testing.B, js jetstream.JetStream, stream, name string, seq uint64) {
	deadline := time.Now().Add(5 * time.Minute)
	info := consumerInfoOf(js, stream, name)
	for {
		if ci := info(); ci != nil && ci.AckFloor.Stream >= seq {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("consumer %s: ack floor below %d after 5 minutes", name, seq)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Side is one way of consuming the messages: Run consumes them on a consumer of its own (named for
// the round) and returns its Result.
type Side struct {
	Name string
	Run  func(round int) Result
}

// Compare runs bare, push, runner and stage (Bare pulled and pushed, a Runner with DoneAtOnce,
// the stage) in Rounds() rounds, rotating their order each round so that load from elsewhere on the
// machine hits them alike, and reports each side's median rate (<side>-<unit>/s) and CPU per message
// (<side>-cpu-us/<unit>), the ratios of the medians (ratio = stage/bare, the goal; push/bare,
// runner/bare, runner/push, <stage>/runner), the lowest per-round stage/bare (min-ratio) and
// cpu-ratio (bare CPU / stage CPU per message, medians). FPMBUS_BENCH_TRACE=1 logs every round.
func Compare(b *testing.B, unit string, bare, push, runner, stage Side) {
	sides := []Side{bare, push, runner, stage}
	rates, cpus := make([][]float64, len(sides)), make([][]float64, len(sides))
	minRatio := 0.0
	for round := range rounds() {
		var r [4]Result
		for k := range sides {
			i := (k + round) % len(sides)
			if !sideEnabled(sides[i].Name) {
				continue
			}
			stop := profile(b, sides[i].Name, round)
			r[i] = sides[i].Run(round)
			stop()
		}
		line := fmt.Sprintf("round %d:", round)
		for i := range sides {
			rates[i], cpus[i] = append(rates[i], r[i].Rate), append(cpus[i], r[i].CPUUs)
			line += fmt.Sprintf(" %s %.0f/s %.2fus", sides[i].Name, r[i].Rate, r[i].CPUUs)
		}
		if ratio := r[3].Rate / r[0].Rate; round == 0 || ratio < minRatio {
			minRatio = ratio
		}
		if os.Getenv("FPMBUS_BENCH_TRACE") != "" {
			b.Log(line)
		}
	}
	m := make([]float64, len(sides))
	for i, s := range sides {
		m[i] = median(rates[i])
		b.ReportMetric(m[i], s.Name+"-"+unit+"/s")
		b.ReportMetric(median(cpus[i]), s.Name+"-cpu-us/"+unit)
	}
	b.ReportMetric(m[3]/m[0], "ratio")
	b.ReportMetric(minRatio, "min-ratio")
	b.ReportMetric(m[1]/m[0], "push/bare")
	b.ReportMetric(m[2]/m[0], "runner/bare")
	b.ReportMetric(m[2]/m[1], "runner/push")
	b.ReportMetric(m[3]/m[2], stage.Name+"/runner")
	b.ReportMetric(median(cpus[0])/median(cpus[3]), "cpu-ratio")
}
