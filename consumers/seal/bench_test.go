package seal

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/internal/natsserver/natsservertest"
	"github.com/fpmbus/fpmbus/streams"
)

var benchCell atomic.Int64

// benchSeal seals b.N distinct cells with n sealers, each on its own connection, and reports seals/s.
func benchSeal(b *testing.B, n int, connect func(i int) *nats.Conn) {
	ctx := context.Background()
	sealers := make([]*Sealer, n)
	for i := range n {
		js, _ := jetstream.New(connect(i))
		kv, err := js.KeyValue(ctx, streams.BucketDatasets)
		if err != nil {
			b.Fatal(err)
		}
		sealers[i], _ = NewSealer(kv)
	}
	base := int(benchCell.Add(int64(b.N)+1)) - b.N
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= b.N {
					return
				}
				c := testCell(base+k, "bench", 1, 8)
				if out, err := sealers[i].Seal(ctx, &c, ""); err != nil || out.Result != sealed {
					b.Errorf("seal: %v %v", out.Result, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "seals/s")
}

func BenchmarkSeal(b *testing.B) {
	b.Run("single-node", func(b *testing.B) {
		env := natsservertest.Start(b)
		if _, err := OpenBucket(context.Background(), env.JS, streams.DefaultConfig()); err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("sealers=%d", n), func(b *testing.B) {
				benchSeal(b, n, func(int) *nats.Conn {
					nc, err := nats.Connect(env.Server.ClientURL())
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(nc.Close)
					return nc
				})
			})
		}
	})
	b.Run("cluster-R3", func(b *testing.B) {
		c := startCluster(b)
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("sealers=%d", n), func(b *testing.B) {
				benchSeal(b, n, func(i int) *nats.Conn { return c.connect(b, i) })
			})
		}
	})
}
