package streams_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

// heapAfterGC is the live heap of this process (the embedded server's included) after a collection.
func heapAfterGC() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkDedupWindowMemory measures what JetStream's duplicate window holds per message id: the
// embedded server (in this process) stores N FPM-sized messages on a file stream without Nats-Msg-Id,
// then N more on another file stream, identical but for a Nats-Msg-Id built as the bridge builds it
// (streams.MsgID), with a duplicate window longer than the run so that no id expires. The difference
// of the two heap growths, per message, is the window's cost of one id (map entry, entry, id string):
// at R FPM/s and window W a stream replica holds R*W of them. FPMBUS_BENCH_N sets N (default 200,000).
//
// Run with: go test ./streams -run '^$' -bench DedupWindowMemory -benchtime 1x
func BenchmarkDedupWindowMemory(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("FPMBUS_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	body := make([]byte, 700) // about an FPM's canonical JSON
	for b.Loop() {
		env := natsservertest.Start(b)
		js, err := jetstream.New(env.NC, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		fill := func(name string, ids bool) uint64 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"},
				Storage: jetstream.FileStorage, Duplicates: time.Hour}); err != nil {
				b.Fatal(err)
			}
			before := heapAfterGC()
			for i := range n {
				k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: fmt.Sprintf("worker-%d", i%64), DPRank: i % 8}
				m := nats.NewMsg(name + ".x")
				m.Data = body
				if ids {
					m.Header.Set(streams.HeaderMsgID, streams.MsgID(k, 1_782_777_600_000, uint64(i)))
				}
				if _, err := js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				b.Fatal("publish: timeout")
			}
			return heapAfterGC() - before
		}
		plain := fill("DEDUPNONE", false)
		withIDs := fill("DEDUPIDS", true)
		idLen := len(streams.MsgID(streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "worker-1", DPRank: 1}, 1_782_777_600_000, uint64(n/2)))
		b.ReportMetric(float64(int64(withIDs)-int64(plain))/float64(n), "dedup-B/id")
		b.ReportMetric(float64(idLen), "id-B")
		b.ReportMetric(0, "ns/op")
		env.NC.Close()
	}
}
