package e2e

import (
	"bytes"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/fpmbus/fpmbus/predict"
	"github.com/fpmbus/fpmbus/predict/service"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// Through `fpmbus predict-service`: every request gets a reply that fits the server's max payload
// (8 MiB). The documented maximum of 10,000 queries, whose answers would not fit one reply, is refused
// (413) naming how many fit, and that many are answered; a 5,000,000-digit number gets a 400 whose
// description is bounded; with the default --max-request-bytes both are refused unread (413). Before,
// neither got any reply. A pool flag of 0 is refused (exit 2).
func TestPredictServiceRepliesToTheLargestRequests(t *testing.T) {
	t.Parallel()
	env := streamstest.Start(t)
	nc, err := nats.Connect(env.Server.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// An answer echoes its query: with a 600-byte id, 10,000 answers are over 8 MiB.
	q := []byte(`{"id":"` + strings.Repeat("q", 600) + `","key":"cell.` + strings.Repeat("0", 64) + `","step":{"num_decode_requests":8,"sum_decode_kv_tokens":20480}}`)
	batch := func(n int) []byte {
		qs := make([][]byte, n)
		for i := range qs {
			qs[i] = q
		}
		return append(append([]byte("["), bytes.Join(qs, []byte(","))...), ']')
	}
	digits := []byte(`{"key":"cell.x","step":{"num_decode_requests":` + strings.Repeat("5", 5_000_000) + `}}`)
	ask := func(body []byte) *nats.Msg {
		t.Helper()
		m, err := nc.Request(service.SubjectPredict, body, 30*time.Second)
		if err != nil {
			t.Fatalf("request of %d bytes: %v", len(body), err)
		}
		return m
	}
	for name, c := range map[string]struct {
		args []string
		run  func(t *testing.T)
	}{
		"--max-request-bytes 8388608": {[]string{"--max-request-bytes", "8388608", "--queue-group", "raised"}, func(t *testing.T) {
			m := ask(batch(service.MaxBatch))
			var e service.ErrorReply
			if err := json.Unmarshal(m.Data, &e); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "413" || e.FitQueries == nil || *e.FitQueries < 1 || *e.FitQueries >= service.MaxBatch {
				t.Fatalf("10,000 queries: %v %.300s (%v)", m.Header, m.Data, err)
			}
			fit := *e.FitQueries
			m = ask(batch(fit))
			var answers []predict.Answer
			if err := json.Unmarshal(m.Data, &answers); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "" || len(answers) != fit {
				t.Fatalf("%d queries, as many as fit: %v, %d answers (%v)", fit, m.Header, len(answers), err)
			}
			m = ask(digits)
			if desc := m.Header.Get(micro.ErrorHeader); m.Header.Get(micro.ErrorCodeHeader) != "400" || len(desc) > len("invalid query: ")+predict.MaxDetail || len(m.Data) > 4096 {
				t.Fatalf("5,000,000 digits: code %q, description of %d bytes, body of %d", m.Header.Get(micro.ErrorCodeHeader), len(desc), len(m.Data))
			}
		}},
		"the defaults": {nil, func(t *testing.T) {
			for what, body := range map[string][]byte{"10,000 queries": batch(service.MaxBatch), "5,000,000 digits": digits} {
				m := ask(body)
				var e service.ErrorReply
				if err := json.Unmarshal(m.Data, &e); err != nil || m.Header.Get(micro.ErrorCodeHeader) != "413" || e.RequestBytes != len(body) || e.MaxRequestBytes != service.DefaultMaxRequestBytes {
					t.Fatalf("%s: %v %.300s (%v)", what, m.Header, m.Data, err)
				}
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			// One instance at a time answers on the subject (the subtests do not run in parallel).
			p := fpmbus(t, "fpmbus predict-service", append([]string{"predict-service", "--server", env.Server.ClientURL()}, c.args...)...)
			p.waitOutput("predict service ready", 30*time.Second)
			c.run(t)
			if err := p.signal(syscall.SIGINT, 30*time.Second); err != nil {
				t.Fatalf("predict-service: %v", err)
			}
		})
	}
	for _, flag := range []string{"--workers", "--queue-size", "--max-request-bytes"} {
		out, err := run(t, 30*time.Second, fpmbusBin, "predict-service", "--server", env.Server.ClientURL(), flag, "0")
		if code := exitCode(err); code != 2 || !strings.Contains(out, flag+" 0: want at least 1") {
			t.Fatalf("%s 0: exit %d:\n%s", flag, code, out)
		}
	}
}
