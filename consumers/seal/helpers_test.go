package seal

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/fpmbus/fpmbus/schemas"
)

func TestMain(m *testing.M) {
	if os.Getenv(nodeEnv) != "" {
		runNode() // this process is a JetStream node of a kill -9 test (kill_test.go)
		return
	}
	goleak.VerifyTestMain(m,
		// nats-server and nats.go leave short-lived goroutines finishing after Shutdown/Close.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Shutdown"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

func testIdentity(i int) schemas.CellIdentity {
	return schemas.CellIdentity{SchemaVersion: schemas.DatasetSchemaVersion, Model: fmt.Sprintf("org/model-%d", i),
		Hardware: "H200-SXM", Backend: "vllm", BackendVersion: "0.29.0", Quantization: "fp8", KVCacheDType: "auto",
		Parallelism:       schemas.Parallelism{TP: 4, PP: 1, DP: 1, MoETP: 4, MoEEP: 1, CP: 1},
		BackendSelections: map[string]string{"attention_backend": "auto"}, ProfileName: "default", ProfileVersion: "1",
		SettingsDigest: strings.Repeat("ab", 32)}
}

// testCell is cell i as run runID measured it; scale varies the latencies (a different attempt).
func testCell(i int, runID string, scale float64, rows int) schemas.Cell {
	c := schemas.Cell{Identity: testIdentity(i), Provenance: schemas.Provenance{RunID: runID, GridDigest: "grid-1",
		ArtefactDigest: schemas.SHA256Hex([]byte(runID))}}
	for r := range rows {
		if r%2 == 0 {
			c.Rows = append(c.Rows, schemas.Row{Phase: schemas.PhasePrefill, NumPrefillRequests: int64(r + 1),
				SumPrefillTokens: int64(128 * (r + 1)), LatencyMS: scale * float64(10+r)})
		} else {
			c.Rows = append(c.Rows, schemas.Row{Phase: schemas.PhaseDecode, NumDecodeRequests: int64(r),
				SumDecodeKVTokens: int64(1024 * r), LatencyMS: scale * float64(5+r)})
		}
	}
	c.Finish()
	return c
}

func testDataset(runID string, cells ...schemas.Cell) *schemas.Dataset {
	return &schemas.Dataset{SchemaVersion: schemas.DatasetSchemaVersion, Kind: schemas.DatasetKind, RunID: runID, Cells: cells}
}
