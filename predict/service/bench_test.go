package service

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// benchQuery is an interpolated decode step of the fixture's model-a cell (two grid points).
var benchQuery = []byte(`{"key":"cell.dd6313e84d8da0d10727b99d29115107816b35076f2fdb26d0e3215ed337bb06","step":{"num_decode_requests":8,"sum_decode_kv_tokens":20480}}`)

var sink predict.Answer

// BenchmarkPredict measures, in one run on one embedded server: predictions per second in process
// (the estimator alone, and with the JSON decoding and encoding the service adds per request), and
// request round trips per second with their p99 against the service and against a bare echo micro
// service (the baseline: request-reply with nothing to compute), interleaved so both see the same
// machine. The round-trip entries report rates and p99s; their ns/op covers 4 echo and 4 predict
// requests per client share. Run: go test ./predict/service -run '^$' -bench Predict -benchtime 2s
func BenchmarkPredict(b *testing.B) {
	env := streamstest.Start(b)
	kv := bucket(b, env)
	svc := serve(b, env, kv, Config{})
	echoConn, err := nats.Connect(env.Server.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer echoConn.Close()
	echo, err := micro.AddService(echoConn, micro.Config{Name: "echo", Version: "1.0.0",
		Endpoint: &micro.EndpointConfig{Subject: "bench.echo", Handler: micro.HandlerFunc(func(r micro.Request) { _ = r.Respond(r.Data()) })}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = echo.Stop() }()
	q, err := predict.DecodeQuery(benchQuery)
	if err != nil {
		b.Fatal(err)
	}
	snap := svc.Snapshot()
	if a := snap.Predict(q, predict.Options{}); a.Status != predict.StatusInterpolated {
		b.Fatalf("bench query: %+v", a)
	}

	b.Run("in-process", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = snap.Predict(q, predict.Options{})
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "predictions/s")
	})
	b.Run("in-process-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			q, _ := predict.DecodeQuery(benchQuery)
			sink = snap.Predict(q, predict.Options{})
			if _, err := json.Marshal(sink); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "predictions/s")
	})
	for _, clients := range []int{1, 8} {
		b.Run(map[int]string{1: "round-trip-1-client", 8: "round-trip-8-clients"}[clients], func(b *testing.B) {
			conns := make([]*nats.Conn, clients)
			for i := range conns {
				if conns[i], err = nats.Connect(env.Server.ClientURL()); err != nil {
					b.Fatal(err)
				}
				defer conns[i].Close()
			}
			per := max(1, b.N/clients)
			phase := func(subject string) (time.Duration, []time.Duration) {
				lat := make([][]time.Duration, clients)
				var wg sync.WaitGroup
				start := time.Now()
				for c := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range per {
							t0 := time.Now()
							if _, err := conns[c].Request(subject, benchQuery, 5*time.Second); err != nil {
								b.Error(err)
								return
							}
							lat[c] = append(lat[c], time.Since(t0))
						}
					}()
				}
				wg.Wait()
				return time.Since(start), slices.Concat(lat...)
			}
			b.ResetTimer()
			// Interleave in rounds so a burst of load on the shared machine hits both alike.
			var echoWall, predWall time.Duration
			var echoLat, predLat []time.Duration
			for round := 0; round < 4; round++ {
				w, l := phase("bench.echo")
				echoWall, echoLat = echoWall+w, append(echoLat, l...)
				w, l = phase(SubjectPredict)
				predWall, predLat = predWall+w, append(predLat, l...)
			}
			echoRate := float64(len(echoLat)) / echoWall.Seconds()
			predRate := float64(len(predLat)) / predWall.Seconds()
			b.ReportMetric(echoRate, "echo-rt/s")
			b.ReportMetric(predRate, "predict-rt/s")
			b.ReportMetric(p99(echoLat), "echo-p99-µs")
			b.ReportMetric(p99(predLat), "predict-p99-µs")
			b.ReportMetric(predRate/echoRate, "predict/echo")
		})
	}
}

func p99(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*99 + 99) / 100 // nearest rank
	return float64(s[min(i, len(s))-1].Microseconds())
}
