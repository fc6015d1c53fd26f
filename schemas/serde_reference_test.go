package schemas

import (
	"bufio"
	"encoding/hex"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
)

// readTSV returns the tab-separated rows of a file under testdata/serde_json (see its README).
func readSerdeTSV(t *testing.T, name string) [][]string {
	t.Helper()
	file, err := os.Open("testdata/serde_json/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var rows [][]string
	sc := bufio.NewScanner(file)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		rows = append(rows, strings.Split(sc.Text(), "\t"))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s is empty", name)
	}
	return rows
}

func TestAppendJSONFloatMatchesSerdeJSON(t *testing.T) {
	for _, row := range readSerdeTSV(t, "f64.tsv") {
		bits, err := strconv.ParseUint(row[0], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(AppendJSONFloat(nil, math.Float64frombits(bits))); got != row[1] {
			t.Errorf("bits %s (%v): got %s, serde_json wrote %s", row[0], math.Float64frombits(bits), got, row[1])
		}
	}
}

func TestCanonicalJSONMatchesDynamoTraceWriter(t *testing.T) {
	for i, row := range readSerdeTSV(t, "fpm.tsv") {
		payload, err := hex.DecodeString(row[0])
		if err != nil {
			t.Fatal(err)
		}
		if row[1] != "OK" {
			t.Fatalf("row %d: reference is not OK: %v", i, row[1:])
		}
		f, err := DecodeFPM(payload)
		if err != nil {
			t.Fatalf("row %d: DecodeFPM: %v", i, err)
		}
		if string(f.JSON) != row[2] {
			t.Errorf("row %d:\n got %s\nwant %s", i, f.JSON, row[2])
		}
	}
}
