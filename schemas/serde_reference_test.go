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

// f64.tsv holds what serde_json wrote with ryu (see testdata/serde_json/README.md). serde_json 1.0.150
// formats with zmij, whose output differs from ryu's in exactly one way, as zmij's own comparison test
// over random bit patterns states: a non-negative exponent is written "e+". zmijFromRyu applies that
// difference, so the reference digits and layout stay the real program's.
func zmijFromRyu(ryu string) string {
	if i := strings.IndexByte(ryu, 'e'); i >= 0 && (i+1 == len(ryu) || ryu[i+1] != '-') {
		return ryu[:i+1] + "+" + ryu[i+1:]
	}
	return ryu
}

// zmijNumbers applies zmijFromRyu to every number of the JSON text js (never inside a string).
func zmijNumbers(js string) string {
	var b strings.Builder
	for i := 0; i < len(js); {
		switch c := js[i]; {
		case c == '"':
			j := i + 1
			for js[j] != '"' {
				if js[j] == '\\' {
					j++
				}
				j++
			}
			b.WriteString(js[i : j+1])
			i = j + 1
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(js) && strings.IndexByte("0123456789.eE+-", js[j]) >= 0 {
				j++
			}
			b.WriteString(zmijFromRyu(js[i:j]))
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

func TestAppendJSONFloatMatchesSerdeJSON(t *testing.T) {
	signed := 0
	for _, row := range readSerdeTSV(t, "f64.tsv") {
		bits, err := strconv.ParseUint(row[0], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		want := zmijFromRyu(row[1])
		if want != row[1] {
			signed++
		}
		if got := string(appendJSONFloat(nil, math.Float64frombits(bits))); got != want {
			t.Errorf("bits %s (%v): got %s, serde_json 1.0.150 writes %s (ryu wrote %s)", row[0],
				math.Float64frombits(bits), got, want, row[1])
		}
	}
	if signed == 0 {
		t.Fatal("f64.tsv has no value with a positive exponent: the one rule zmij changed is untested")
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
		if want := zmijNumbers(row[2]); string(f.JSON) != want {
			t.Errorf("row %d:\n got %s\nwant %s", i, f.JSON, want)
		}
	}
}
